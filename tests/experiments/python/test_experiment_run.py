"""`specula experiment run` and `report` as real processes: resume after a kill and after Ctrl-C,
a changed spec refused, identical tokens from the same spec and seed, online runs in process and
against a real `specula serve` (with their per-request traces and goodput), and the quickstart spec
with its report (the bounded CI run).

Environment: SPECULA_BINARY, SPECULA_SOURCE_DIR, SPECULA_MODELS (as the serving tests).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE = os.environ.get("SPECULA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../..")))
sys.path.insert(0, os.path.join(SOURCE, "tests/serving/python"))
from serving_util import BINARY, DRAFT, TARGET, TOKENIZER, Serve  # noqa: E402

PROMPTS = os.path.join(SOURCE, "experiments/specs/prompts.jsonl")
QUICK = os.environ.get("SPECULA_QUICK") == "1"


def spec_text(sweep, workload="num_requests: 16 max_tokens: 32 seed: 1", extra=""):
    return (f'name: "t"\nmodel {{ path: "{TARGET}" tokenizer: "{TOKENIZER}" }}\ndraft {{ path: "{DRAFT}" }}\n'
            f'workload {{ prompts_file: "{PROMPTS}" {workload} }}\nsweep {{ {sweep} }}\n{extra}')


def results(out):
    with open(os.path.join(out, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def count_lines(path):
    with open(path) as f:
        return f.read().count("\n")


def trace_lines(out, row):
    """The run's trace (record_trace), which its results line names relative to DIR."""
    with open(os.path.join(out, row["trace"])) as f:
        return [json.loads(line) for line in f]


def run(*args, **kw):
    return subprocess.run([BINARY, "experiment", *args], capture_output=True, text=True, timeout=600, **kw)


class ExperimentRunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="specula_exp_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write_spec(self, text, name="spec.textproto"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start_and_stop_after(self, spec, out, lines, sig):
        """Starts a run and sends `sig` once results.jsonl has `lines` lines; returns (rc, stderr)."""
        proc = subprocess.Popen([BINARY, "experiment", "run", spec, "--out", out], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        path, deadline = os.path.join(out, "results.jsonl"), time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(path) and count_lines(path) >= lines:
                proc.send_signal(sig)
                break
            time.sleep(0.005)
        _, err = proc.communicate(timeout=120)
        return proc.returncode, err

    def test_resume_runs_only_the_missing_points(self):
        # 16 runs of ~0.1-0.5 s each: killed after 3, interrupted after 8, then finished.
        spec = self.write_spec(spec_text('max_num_seqs: [1, 4] spec_method: ["none", "ngram"] '
                                         'num_spec_tokens: [1, 2, 4] temperature: [0, 0.8]',
                                         workload="num_requests: 32 max_tokens: 64 seed: 1"))
        out = os.path.join(self.tmp, "out")
        rc, err = self.start_and_stop_after(spec, out, 3, signal.SIGKILL)
        self.assertEqual(rc, -signal.SIGKILL, err)
        with open(os.path.join(out, "results.jsonl")) as f:
            killed = f.read()
        n_killed = killed.count("\n")
        self.assertGreaterEqual(n_killed, 3)
        self.assertLess(n_killed, 16)
        # A kill mid-write leaves a torn line: the next run drops it.
        with open(os.path.join(out, "results.jsonl"), "a") as f:
            f.write('{"key": "max_num_seqs=1,spec_method=none", "rep')

        rc, err = self.start_and_stop_after(spec, out, n_killed + 5, signal.SIGINT)
        self.assertEqual(rc, 130, err)
        self.assertIn("dropped a torn last line", err)
        self.assertIn(f"16 runs; {n_killed} done, {16 - n_killed} to run", err)
        self.assertIn("interrupted: ", err)
        self.assertIn("run the same command again to resume", err)
        with open(os.path.join(out, "results.jsonl")) as f:
            interrupted = f.read()
        self.assertTrue(interrupted.startswith(killed), "lines already written changed")
        n_interrupted = interrupted.count("\n")
        self.assertLess(n_interrupted, 16)
        for line in interrupted.splitlines():
            json.loads(line)  # only whole lines

        r = run("run", spec, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{n_interrupted} done, {16 - n_interrupted} to run", r.stderr)
        executed = [line for line in r.stderr.splitlines() if line.startswith("[experiment] run ")]
        self.assertEqual(len(executed), 16 - n_interrupted, r.stderr)  # only the missing runs
        rows = results(out)
        self.assertEqual(len(rows), 16)
        self.assertEqual(len({(j["key"], j["repeat"]) for j in rows}), 16)
        with open(os.path.join(out, "results.jsonl")) as f:
            self.assertTrue(f.read().startswith(interrupted))

        # Nothing left: a rerun runs nothing.
        r = run("run", spec, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("16 done, 0 to run", r.stderr)
        self.assertEqual(len(results(out)), 16)

    def test_changed_spec_is_refused_and_force_starts_over(self):
        out = os.path.join(self.tmp, "out")
        spec = self.write_spec(spec_text('max_num_seqs: [2]'))
        self.assertEqual(run("run", spec, "--out", out).returncode, 0)
        with open(os.path.join(out, "run.json")) as f:
            info = json.load(f)
        for field in ("spec", "spec_hash", "git_commit", "build_type", "cpu", "threads", "simd", "date"):
            self.assertIn(field, info)
        self.assertEqual(info["spec"]["sweep"]["max_num_seqs"], [2])
        changed = self.write_spec(spec_text('max_num_seqs: [4]'), "changed.textproto")
        r = run("run", changed, "--out", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("holds the results of another spec", r.stderr)
        self.assertIn("--force", r.stderr)
        self.assertEqual(results(out)[0]["point"]["max_num_seqs"], 2)  # untouched
        r = run("run", changed, "--out", out, "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([j["point"]["max_num_seqs"] for j in results(out)], [4])

    # Results fields that come from a clock; every other field of a run must match.
    CLOCK_FIELDS = {"duration_s", "request_throughput", "output_tok_s", "total_tok_s", "ttft_ms", "tpot_ms", "e2e_ms",
                    "elapsed_s", "goodput", "request_goodput"}

    def test_parts_merge_into_one_runs_results(self):
        # 3 groups (max_num_seqs) of a baseline and two speculative points, sampled: 9 runs, split 3 ways.
        sweep = 'max_num_seqs: [1, 2, 4] spec_method: ["none", "ngram"] num_spec_tokens: [2, 4] temperature: [0.8]'
        spec = self.write_spec(spec_text(sweep, "num_requests: 4 max_tokens: 12 seed: 3"))
        whole, merged = os.path.join(self.tmp, "whole"), os.path.join(self.tmp, "merged")
        parts = [os.path.join(self.tmp, f"part-{i}") for i in range(3)]
        for args in [("--out", whole)] + [("--out", d, "--part", f"{i}/3") for i, d in enumerate(parts)]:
            r = run("run", spec, *args, "--no-progress")
            self.assertEqual(r.returncode, 0, r.stderr)
        keys = []
        for d in parts:
            with open(os.path.join(d, "run.json")) as f:
                part = json.load(f)["part"]
            self.assertEqual(part["keys"], [j["key"] for j in results(d)])
            # A part holds whole groups: each speculative point beside its none baseline.
            self.assertEqual({j["point"]["max_num_seqs"] for j in results(d)},
                             {j["point"]["max_num_seqs"] for j in results(d) if j["point"]["spec_method"] == "none"})
            keys += part["keys"]
        self.assertEqual(sorted(keys), sorted(j["key"] for j in results(whole)))
        r = run("report", *parts, "--out", merged)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(merged, "report.md")))
        one = {(j["key"], j["repeat"]): j for j in results(whole)}
        got = {(j["key"], j["repeat"]): j for j in results(merged)}
        self.assertEqual(set(got), set(one))
        compared = sorted(set(next(iter(one.values()))) - self.CLOCK_FIELDS)
        for k in ("point", "completed", "input_tokens", "output_tokens", "spec", "output_hash"):
            self.assertIn(k, compared)
        for key, row in one.items():
            self.assertEqual({f: got[key].get(f) for f in compared}, {f: row.get(f) for f in compared}, key)
        with open(os.path.join(merged, "run.json")) as f, open(os.path.join(whole, "run.json")) as g:
            m, w = json.load(f), json.load(g)
        self.assertEqual((m["spec_hash"], m["points"], m["repeats"]), (w["spec_hash"], w["points"], w["repeats"]))
        self.assertEqual([x["part"] for x in m["merged_from"]], ["0/3", "1/3", "2/3"])
        r = run("report", parts[2], parts[0], "--out", os.path.join(self.tmp, "gap"))
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"part 1/3 missing (have {parts[2]}: part 2/3, {parts[0]}: part 0/3)", r.stderr)
        print(f"\nfields compared in {len(one)} runs: {', '.join(compared)}", file=sys.stderr)

    def test_parts_refused_by_name(self):
        spec = self.write_spec(spec_text('max_num_seqs: [1, 2]', "num_requests: 2 max_tokens: 4 seed: 1"))
        other = self.write_spec(spec_text('max_num_seqs: [1, 2]', "num_requests: 3 max_tokens: 4 seed: 1"), "o.textproto")
        for bad, msg in (("3/3", "--part: 3/3: I must be in [0, 2]"), ("0/0", "--part: 0/0: N must be at least 1"),
                         ("-1/2", "I must be in [0, 1]"), ("1", "--part: '1' is not I/N"), ("a/b", "is not I/N")):
            r = run("run", spec, "--out", os.path.join(self.tmp, "x"), "--part", bad)
            self.assertEqual(r.returncode, 1, bad)
            self.assertIn(msg, r.stderr)
        d = [os.path.join(self.tmp, n) for n in ("p0", "p1", "q1", "whole")]
        for s_, out, part in ((spec, d[0], "0/2"), (spec, d[1], "1/2"), (other, d[2], "1/2")):
            self.assertEqual(run("run", s_, "--out", out, "--part", part, "--no-progress").returncode, 0)
        self.assertEqual(run("run", spec, "--out", d[3], "--no-progress").returncode, 0)
        r = run("run", spec, "--out", d[0], "--part", "1/2")
        self.assertIn(f"{d[0]} holds part 0/2 of this spec; this run is part 1/2", r.stderr)
        out = os.path.join(self.tmp, "m")
        for dirs, msg in (([d[0], d[0]], "are both part 0/2"), ([d[0], d[2]], "of another spec"),
                          ([d[1], d[0], d[1]], "are both part 1/2"), ([d[0], d[3]], "holds a whole run, not a part")):
            r = run("report", *dirs, "--out", out)
            self.assertEqual(r.returncode, 2, dirs)
            self.assertIn(msg, r.stderr)
        r = run("report", d[1], os.path.join(self.tmp, "none-such"), "--out", out)
        self.assertIn("none-such: no such directory", r.stderr)
        r = run("report", d[0], d[1])
        self.assertIn("give --out", r.stderr)
        r = run("report", d[0], d[1], "--out", d[1])
        self.assertIn(f"--out: {d[1]} is one of the parts", r.stderr)
        os.remove(os.path.join(d[1], "results.jsonl"))
        with open(os.path.join(d[1], "results.jsonl"), "w"):
            pass
        r = run("report", d[0], d[1], "--out", out)
        self.assertIn("part 1/2 is incomplete: 0 of 1 runs", r.stderr)
        r = run("report", d[0], "--out", out)  # one DIR: a report of that part alone
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_malformed_spec_fails_before_anything_runs(self):
        spec = self.write_spec(spec_text('max_num_seqs: [1, 0]'))
        out = os.path.join(self.tmp, "out")
        r = run("run", spec, "--out", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{spec}:5:27: sweep.max_num_seqs[1]: 0 is not in [1, 1024]", r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_same_spec_and_seed_give_the_same_tokens(self):
        spec = self.write_spec(spec_text('max_num_seqs: [1, 8] spec_method: ["none", "draft", "ngram"] '
                                         'num_spec_tokens: [3, 0] temperature: [0, 0.8]'))
        a, b = os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")
        for out in (a, b):
            r = run("run", spec, "--out", out, "--no-progress")
            self.assertEqual(r.returncode, 0, r.stderr)
        ra = {j["key"]: j for j in results(a)}
        rb = {j["key"]: j for j in results(b)}
        self.assertEqual(ra.keys(), rb.keys())
        compared = 0
        for key, j in ra.items():
            p = j["point"]
            # Set for auto runs only; the n-gram proposer has no draft model, so drafts always may pay.
            if p["spec_method"] == "none" or p["num_spec_tokens"] != 0:
                self.assertIsNone(j["drafts_cannot_pay"], key)
            elif p["spec_method"] == "ngram":
                self.assertIs(j["drafts_cannot_pay"], False, key)
            else:
                self.assertIsInstance(j["drafts_cannot_pay"], bool, key)
            # Adaptive k follows measured step times, and with sampling the drafts it chose change
            # which random numbers each token uses: equal in distribution, not token for token.
            if p["num_spec_tokens"] == 0 and p["temperature"] > 0:
                continue
            self.assertEqual(j["output_hash"], rb[key]["output_hash"], key)
            self.assertEqual(j["output_tokens"], rb[key]["output_tokens"], key)
            compared += 1
        self.assertEqual(compared, 2 * 5 + 2 * 3)
        # Lossless: greedy speculation gives plain greedy's tokens, at every batch size.
        greedy = {j["output_hash"] for j in ra.values() if j["point"]["temperature"] == 0}
        self.assertEqual(len(greedy), 1, greedy)

    def test_online_in_process_matches_offline_tokens(self):
        common = 'max_num_seqs: [8] spec_method: ["none", "draft"] num_spec_tokens: [2, 0]'
        off = self.write_spec(spec_text(common), "off.textproto")
        on = self.write_spec(spec_text(common + ' request_rate: [50, inf] burstiness: [1, 0.5]',
                                       extra="mode: ONLINE\nrecord_trace: true\n"), "on.textproto")
        for spec, out in ((off, "off"), (on, "on")):
            r = run("run", spec, "--out", os.path.join(self.tmp, out))
            self.assertEqual(r.returncode, 0, r.stderr)
        offline = results(os.path.join(self.tmp, "off"))
        online = results(os.path.join(self.tmp, "on"))
        self.assertEqual(len(online), 3 * 2 * 2)
        self.assertTrue(all(j["goodput"] == 1 and "trace" not in j for j in offline))  # no SLO: the completed share
        for j in online:
            self.assertEqual(j["completed"], 16, j)
            self.assertEqual(j["goodput"], 1, j)
            self.assertEqual(j["trace"], f'traces/{j["key"]}-r0.jsonl')
            trace = trace_lines(os.path.join(self.tmp, "on"), j)
            self.assertEqual(len(trace), 16)
            self.assertEqual(sum(t["output_tokens"] for t in trace), j["output_tokens"])
            self.assertTrue(all(t["ok"] and t["finish_s"] >= t["arrival_s"] for t in trace))
            self.assertGreater(j["ttft_ms"]["p99"], 0)
            self.assertEqual(j["output_hash"], offline[0]["output_hash"], j["key"])  # greedy: same tokens
            if j["point"]["num_spec_tokens"] == 0:
                self.assertEqual(sum(j["k_histogram"]) > 0, True)
            if j["point"]["spec_method"] == "draft" and j["point"]["num_spec_tokens"] == 2:
                self.assertGreater(j["spec"]["drafts"], 0)
                self.assertEqual(len(j["spec"]["acceptance_per_position"]), 2)
        self.assertEqual({j["point"]["request_rate"] for j in online}, {50, "inf"})

    def test_online_against_a_real_server(self):
        with Serve("--max-num-seqs", "8") as s:
            spec = self.write_spec(spec_text('request_rate: [40] temperature: [0, 0.5]',
                                             extra=f'mode: ONLINE\nendpoint: "grpc://{s.grpc_target}"\n'
                                                   'record_trace: true\n'))
            out = os.path.join(self.tmp, "out")
            r = run("run", spec, "--out", out)
            self.assertEqual(r.returncode, 0, r.stderr)
        rows = results(out)
        self.assertEqual([j["point"]["temperature"] for j in rows], [0, 0.5])
        for j in rows:
            self.assertEqual(j["completed"], 16, j)
            self.assertIsNone(j["point"]["max_num_seqs"])  # the server's, not recorded as swept
            self.assertGreater(j["output_tokens"], 0)
            trace = trace_lines(out, j)
            self.assertEqual([t["ok"] for t in trace], [True] * 16)
            self.assertEqual(sum(t["output_tokens"] for t in trace), j["output_tokens"])

    def test_quickstart_spec_runs_and_its_report_renders(self):
        out = os.path.join(self.tmp, "quickstart")
        spec, requests = os.path.join(SOURCE, "experiments/specs/quickstart.textproto"), 64
        if QUICK:  # the sanitizer runs: the same sweep over 8 requests of 16 tokens (a copy, paths made absolute)
            requests = 8
            with open(os.path.join(SOURCE, "experiments/specs/quickstart.textproto")) as f:
                text = f.read().replace("num_requests: 64 max_tokens: 128", "num_requests: 8 max_tokens: 16")
            self.assertIn("num_requests: 8 max_tokens: 16", text)
            spec = self.write_spec(text.replace('"../../models/', f'"{os.path.join(SOURCE, "models/")}')
                                   .replace('"prompts.jsonl"', f'"{PROMPTS}"'), "quickstart.textproto")
        r = run("run", spec, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = results(out)
        self.assertEqual(len(rows), 15 * 2)
        self.assertTrue(all(j["completed"] == requests for j in rows))
        r = run("report", out, "--target-qps", "10,100")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "report.md")) as f:
            report = f.read()
        for section in ("## Assumptions", "## Best configuration per batch size", "## Capacity plan"):
            self.assertIn(section, report)
        for png in ("throughput_vs_batch.png", "speedup_vs_batch.png", "acceptance_by_position.png"):
            self.assertIn(f"]({png})", report)
            with open(os.path.join(out, png), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
