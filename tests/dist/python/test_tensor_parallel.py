"""Tensor parallelism through real `mpirun` processes (the CPU/MPI path).

TP = 2 (and TP = 3 where the heads allow it) must give the tokens of TP = 1: greedy single prompts,
and 32-prompt batches with prefix caching, a KV pool small enough to force preemption, and
speculation (draft model and n-gram, fixed k and auto); sampled output with a fixed seed too. A rank
killed mid-run makes rank 0 fail with the collective's error, and no process is left behind.

usage: test_tensor_parallel.py SPECULA MODELS_DIR [--quick]
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

SPECULA = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build/release/specula"
MODELS = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models", "tinystories")
QUICK = "--quick" in sys.argv or os.environ.get("SPECULA_QUICK") == "1"
# Debian's OpenMPI refuses root without --allow-run-as-root, and more ranks than cores without
# --oversubscribe; one OpenMP thread per rank keeps the ranks off each other's cores.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-x", "OMP_NUM_THREADS=1"]
STARTS = ["Once upon a time", "Lily and Ben", "The little dog", "One day, Tom", "There was a big tree",
          "Sue had a red ball", "The sun was hot", "Mom said"]


def stderr_tail(err):
    """The end of a failed run's stderr, and any sanitizer report in it whole (a 3,000-character tail
    cut off the UBSan report of a TP follower once, ahead of the other ranks' shutdown noise)."""
    marks = [i for i in (err.find("runtime error:"), err.find("Sanitizer")) if i >= 0]
    if marks:
        start = err.rfind("\n", 0, min(marks)) + 1
        return err[start:start + 20000] + ("\n...\n" + err[-3000:] if len(err) > start + 20000 else "")
    return err[-3000:]


def run(tp, args, timeout=300):
    """specula with `args` under mpirun -np tp; returns stdout (raises with stderr on failure)."""
    cmd = MPIRUN + ["-np", str(tp), SPECULA, "generate"] + args + ["--tensor-parallel-size", str(tp)]
    p = subprocess.run(cmd, capture_output=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {' '.join(cmd)}\n{stderr_tail(p.stderr.decode(errors='replace'))}")
    return p.stdout, p.stderr.decode(errors="replace")


def batch_tokens(out):
    rows = [json.loads(l) for l in out.decode().splitlines() if l.strip()]
    return {r["id"]: r["token_ids"] for r in rows}


class TensorParallelTest(unittest.TestCase):
    tmp = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specula_tp_")
        # Random models of real shapes (make-model): stories15m (6 heads, 6 KV heads) and smollm2-135m
        # (9 heads over 3 KV heads: TP = 3 gives one KV head each, TP = 2 replicates one), with a
        # smaller vocabulary to keep the runs short, and a tiny random draft for each vocabulary.
        for name, shape, vocab in [("s15m", "stories15m", 32000), ("smollm2", "smollm2-135m", 4096),
                                   ("draft32000", "tiny", 32000), ("draft4096", "tiny", 4096)]:
            subprocess.run([SPECULA, "make-model", "--shape", shape, "--vocab", str(vocab), "--seed", "3",
                            "--out", os.path.join(cls.tmp, name)], check=True, capture_output=True)
        cls.prompts = os.path.join(cls.tmp, "prompts.jsonl")
        with open(cls.prompts, "w") as f:
            for i in range(32):
                # Shared starts (prefix caching) and varied lengths.
                f.write(json.dumps({"id": i, "prompt": STARTS[i % 8] + " and then" * (i % 3),
                                    "max_tokens": 12 + i % 9}) + "\n")
        # Sampled requests: plain temperature, and with top-p and top-k (real model only: on the
        # near-flat logits of random weights, which tokens make the top-p set flips on a 1e-7 move,
        # and each flip shifts the draw by a token).
        cls.sampled, cls.sampled_truncated = (os.path.join(cls.tmp, f) for f in ("sampled.jsonl", "truncated.jsonl"))
        for path, extra in [(cls.sampled, {}), (cls.sampled_truncated, {"top_p": 0.95, "top_k": 40})]:
            with open(path, "w") as f:
                for i in range(8):
                    f.write(json.dumps(dict({"id": i, "prompt": STARTS[i], "max_tokens": 16, "temperature": 0.9,
                                             "seed": 100 + i}, **extra)) + "\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def models(self):
        # The random models run with an f32 KV cache. TP sums o_proj and down in another order than
        # one rank does (two partial sums, then the all-reduce), which moves activations by ~1e-7;
        # a bf16 cache rounds K and V to 8 bits of mantissa, so such a move occasionally flips a
        # rounding, and random weights give near-flat logits where that flips a greedy near-tie or
        # moves an inverse-CDF draw by a few token ids (README, "Tensor parallelism"). The real
        # model keeps the default bf16 cache.
        t = self.tmp
        f32 = ["--kv-cache-dtype", "f32"]
        return {
            "stories260K": ([f"--model", f"{MODELS}/stories260K.bin", "--tokenizer", f"{MODELS}/tok512.bin"],
                            f"{MODELS}/stories260K-draft.bin", [2]),
            "s15m": (["--model", f"{t}/s15m"] + f32, f"{t}/draft32000", [2, 3]),
            "smollm2": (["--model", f"{t}/smollm2"] + f32, f"{t}/draft4096", [2, 3]),
        }

    def check_same(self, label, tps, args, parse):
        want = parse(run(1, args)[0])
        self.assertTrue(want, f"{label}: TP = 1 produced nothing")
        for tp in tps:
            got = parse(run(tp, args)[0])
            self.assertEqual(got, want, f"{label}: TP = {tp} differs from TP = 1")

    def test_single_prompt_greedy_and_sampled(self):
        for name, (model, _, tps) in self.models().items():
            with self.subTest(model=name):
                base = model + ["--prompt", "Once upon a time", "--max-tokens", "24", "--ignore-eos"]
                self.check_same(f"{name} greedy", tps, base, lambda o: o)
                self.check_same(f"{name} sampled", tps, base + ["--temperature", "0.9", "--seed", "11"], lambda o: o)

    def test_batch_with_speculation_prefix_caching_and_preemption(self):
        for name, (model, draft, tps) in self.models().items():
            # 16-token blocks: 40 blocks hold a few of the 32 sequences at once, so the scheduler
            # preempts; the prompts share starts, so the prefix cache hits.
            common = model + ["--prompts-file", self.prompts, "--max-num-seqs", "32", "--num-blocks", "40",
                              "--ignore-eos", "--no-progress"]
            variants = {"plain": [],
                        "draft k=4": ["--spec-method", "draft", "--draft-model", draft, "--num-spec-tokens", "4"],
                        "draft auto": ["--spec-method", "draft", "--draft-model", draft, "--num-spec-tokens", "auto"],
                        "ngram k=3": ["--spec-method", "ngram", "--num-spec-tokens", "3"],
                        "ngram auto": ["--spec-method", "ngram", "--num-spec-tokens", "auto"]}
            if QUICK and name != "stories260K":  # CI's bounded run: one variant on the random models, no sampled batch
                if os.environ.get("SPECULA_SANITIZER"):  # none under ASan, where one smollm2-shape batch takes minutes
                    continue
                variants = {"draft auto": variants["draft auto"]}
            for label, extra in variants.items():
                with self.subTest(model=name, variant=label):
                    out, err = run(1, common + extra)
                    want = batch_tokens(out)
                    self.assertEqual(len(want), 32)
                    m = re.search(r"(\d+) preemptions, prefix-cache hit rate ([\d.]+)%", err)
                    self.assertIsNotNone(m, err[-2000:])
                    self.assertGreater(int(m.group(1)), 0, f"{name} {label}: no preemption")
                    self.assertGreater(float(m.group(2)), 0, f"{name} {label}: no prefix-cache hit")
                    for tp in tps:
                        self.assertEqual(batch_tokens(run(tp, common + extra)[0]), want,
                                         f"{name} {label}: TP = {tp} differs from TP = 1")
            # Fixed k: under auto, k follows measured step times, and with sampling another k draws
            # other random numbers (lossless in distribution, not draw for draw), even at TP = 1.
            spec = ["--spec-method", "draft", "--draft-model", draft, "--num-spec-tokens", "4"]
            files = [self.sampled] + ([self.sampled_truncated] if name == "stories260K" else [])
            if QUICK and name != "stories260K":
                files = []
            for path in files:
                with self.subTest(model=name, variant=f"sampled batch {os.path.basename(path)}"):
                    self.check_same(f"{name} sampled batch {path}", tps,
                                    model + ["--prompts-file", path, "--no-progress"] + spec, batch_tokens)

    def test_experiment_run_matches_tp1(self):
        # `mpirun -np 2 specula experiment run --tensor-parallel-size 2`: rank 0 sweeps and sends each
        # point's flags; every point's output hash (all requests' tokens) equals the TP = 1 sweep's,
        # offline and online (in process, through the serving core), with and without speculation.
        spec_path = os.path.join(self.tmp, "tp.textproto")
        for mode, extra in [("OFFLINE", ""), ("ONLINE", " request_rate: [50]")]:
            with open(spec_path, "w") as f:
                f.write(f'name: "tp-{mode}"\n'
                        f'model {{ path: "{MODELS}/stories260K.bin" tokenizer: "{MODELS}/tok512.bin" }}\n'
                        f'draft {{ path: "{MODELS}/stories260K-draft.bin" }}\n'
                        f'workload {{ prompts_file: "{self.prompts}" num_requests: 16 max_tokens: 24 seed: 1 }}\n'
                        f'mode: {mode}\n'
                        f'sweep {{ max_num_seqs: [1, 8] spec_method: ["none", "draft", "ngram"] num_spec_tokens: [3, 0]{extra} }}\n'
                        'repeats: 1\n')
            hashes = []
            for tp in (1, 2):
                out = os.path.join(self.tmp, f"exp-{mode}-{tp}")
                cmd = ([SPECULA] if tp == 1 else MPIRUN + ["-np", str(tp), SPECULA]) + \
                    ["experiment", "run", spec_path, "--out", out, "--no-progress"] + \
                    ([] if tp == 1 else ["--tensor-parallel-size", str(tp)])
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                self.assertEqual(p.returncode, 0, f"{' '.join(cmd)}\n{stderr_tail(p.stderr)}")
                with open(os.path.join(out, "results.jsonl")) as f:
                    hashes.append({json.loads(l)["key"]: json.loads(l)["output_hash"] for l in f})
            self.assertEqual(len(hashes[0]), 10, mode)  # 2 batch sizes x (none + 2 methods x 2 k)
            self.assertEqual(hashes[1], hashes[0], mode)
        # Without mpirun: refused before anything runs, with the command to use.
        p = subprocess.run([SPECULA, "experiment", "run", spec_path, "--out", os.path.join(self.tmp, "exp-refused"),
                            "--tensor-parallel-size", "2"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("needs 2 processes, but 1 were launched", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "exp-refused", "results.jsonl")))

    def test_serve_refuses_a_reload_by_name(self):
        # A reload would have every rank load its shard in step: refused (409) while rank 0 serves on.
        cmd = MPIRUN + ["-np", "2", SPECULA, "serve", "--model", f"{MODELS}/stories260K.bin", "--tokenizer",
                        f"{MODELS}/tok512.bin", "--tensor-parallel-size", "2", "--api-key", "k", "--grpc-port", "0",
                        "--http-port", "0"]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            lines = []
            while not (m := re.search(r"and http (\S+):(\d+) .*ready", lines[-1] if lines else "")):
                line = p.stderr.readline()
                self.assertTrue(line, "".join(lines))
                lines.append(line)
            base = f"http://{m.group(1)}:{m.group(2)}"
            req = urllib.request.Request(base + "/admin/reload", method="POST", headers={"Authorization": "Bearer k"},
                                         data=json.dumps({"model": f"{MODELS}/stories260K-draft.bin"}).encode())
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=60)
            self.assertEqual(e.exception.code, 409)
            self.assertIn("not offered under --tensor-parallel-size 2", e.exception.read().decode())
            req = urllib.request.Request(base + "/v1/completions", headers={"Authorization": "Bearer k"},
                                         data=json.dumps({"prompt": "Once", "max_tokens": 4}).encode())
            with urllib.request.urlopen(req, timeout=60) as r:
                self.assertEqual(json.loads(r.read())["usage"]["completion_tokens"], 4)
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)  # mpirun's own status when it forwards a signal: not the server's
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()

    def test_refusals_name_the_numbers(self):
        # Without mpirun: the launch is refused with the command to use.
        p = subprocess.run([SPECULA, "generate", "--model", f"{MODELS}/stories260K.bin", "--prompt", "x",
                            "--tensor-parallel-size", "2"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--tensor-parallel-size 2 needs 2 processes, but 1 were launched", p.stderr)
        self.assertIn("mpirun -np 2", p.stderr)
        # More ranks than heads (stories260K has 8): refused before the group forms, with the numbers.
        p = subprocess.run([SPECULA, "generate", "--model", f"{MODELS}/stories260K.bin", "--prompt", "x",
                            "--tensor-parallel-size", "9"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--tensor-parallel-size 9 exceeds the model's 8 attention heads", p.stderr)

    def test_killed_rank_fails_rank_zero_with_the_collective(self):
        timeout_s = 20
        cmd = MPIRUN + ["-np", "2", SPECULA, "generate", "--model", f"{self.tmp}/smollm2", "--prompt", "Hello",
                        "--max-tokens", "4000", "--ignore-eos", "--tensor-parallel-size", "2",
                        "--collective-timeout-s", str(timeout_s)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
        try:
            p.stdout.read(16)  # generating: both ranks are in the step loop
            ranks = {}
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read()
                except OSError:
                    continue
                if SPECULA.encode() in cmdline and any(e.startswith(b"OMPI_COMM_WORLD_RANK=") for e in env):
                    rank = [e for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")][0].split(b"=")[1]
                    ranks[int(rank)] = int(pid)
            self.assertEqual(sorted(ranks), [0, 1], ranks)
            killed = time.monotonic()
            os.kill(ranks[1], signal.SIGKILL)
            _, err = p.communicate(timeout=timeout_s + 30)
            elapsed = time.monotonic() - killed
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        err = err.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(err, r"rank 0 of 2: collective \w+ '[^']+' \(call \d+\) failed: rank 1 \(pid \d+\) has exited")
        self.assertLess(elapsed, timeout_s)
        time.sleep(0.5)
        for pid in ranks.values():
            self.assertFalse(os.path.exists(f"/proc/{pid}") and
                             open(f"/proc/{pid}/stat").read().split(") ")[1][0] not in "ZX",
                             f"pid {pid} is still running")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"] + [a for a in sys.argv[3:] if a != "--quick"])
