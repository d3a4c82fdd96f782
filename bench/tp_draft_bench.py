#!/usr/bin/env python3
"""Where the draft model runs under tensor parallelism: on rank 0 only, or replicated on every rank.

Two measurements, on random models (a stories15m-shape target, TP = 2 over MPI with one thread per
rank, and a 2-layer, 64-wide draft with the target's vocabulary), medians of --repeats interleaved
runs:

1. What rank 0's time outside the target's forward costs the other ranks. SPECULA_COMM_STATS=1
   makes rank 1 report how long it waited for step plans: rank 0's scheduling, sampling and
   verification, plus the draft's forwards when there is a draft. Measured without speculation
   and with the draft at fixed k.
2. What replication would cost on this machine: the draft's decode speed alone, and with a second
   copy running at the same time (two processes, as two replicated ranks would run it).

A replicated draft cannot shorten a step: the target's forward needs the proposals, and each rank
would compute the same proposals in the same time. It would only spare rank 0 sending them, and
they already travel in the step plan (4 bytes per token). What it can do is slow the draft down
where ranks share memory bandwidth, as on a CPU.

usage: bench/tp_draft_bench.py [--specula build/release/specula] [--k 4] [--max-tokens 200] [--repeats 5]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
PROMPT = "Once upon a time there was"


def tp_run(specula, target, draft, k, max_tokens):
    """(decode tok/s, rank 1's wait for step plans in ms per step, tokens per step) of one TP = 2 run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", SPECULA_COMM_STATS="1")
    spec = ["--spec-method", "draft", "--draft-model", draft, "--num-spec-tokens", str(k)] if draft else []
    cmd = MPIRUN + ["-x", "OMP_NUM_THREADS", "-x", "SPECULA_COMM_STATS", "-np", "2", specula, "generate", "--model",
                    target, "--prompt", PROMPT, "--max-tokens", str(max_tokens), "--ignore-eos",
                    "--tensor-parallel-size", "2"] + spec
    err = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    tok_s = float(re.search(r"decode: ([\d.]+) tokens/s", err).group(1))
    m = re.search(r"rank 1 collectives:.*waiting for step plans (\d+) calls ([\d.]+) s", err)
    accept = re.search(r"mean acceptance length ([\d.]+)", err)
    return tok_s, 1000 * float(m.group(2)) / int(m.group(1)), float(accept.group(1)) if accept else 1.0


def draft_alone(specula, draft, max_tokens, copies):
    """Decode tok/s of each of `copies` draft processes started together."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [specula, "generate", "--model", draft, "--prompt", PROMPT, "--max-tokens", str(max_tokens), "--ignore-eos"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(copies)]
    rates = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"draft run failed: {err.strip()}")
        rates.append(float(re.search(r"decode: ([\d.]+) tokens/s", err).group(1)))
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specula", default="build/release/specula")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = os.path.join(tmp, "target"), os.path.join(tmp, "draft")
        subprocess.run([a.specula, "make-model", "--shape", "stories15m", "--out", target, "--seed", "1"], check=True,
                       capture_output=True)
        with open(os.path.join(target, "config.json")) as f:
            config = json.load(f)
        config.update(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=32)
        with open(os.path.join(tmp, "draft.json"), "w") as f:
            json.dump(config, f)
        subprocess.run([a.specula, "make-model", "--config", os.path.join(tmp, "draft.json"), "--out", draft, "--seed",
                        "2"], check=True, capture_output=True)
        plain, spec, alone, pair = [], [], [], []
        for _ in range(a.repeats):  # interleaved: the machine's noise falls on every configuration
            plain.append(tp_run(a.specula, target, None, a.k, a.max_tokens))
            spec.append(tp_run(a.specula, target, draft, a.k, a.max_tokens))
            alone.append(draft_alone(a.specula, draft, 4 * a.max_tokens, 1)[0])
            pair.append(statistics.mean(draft_alone(a.specula, draft, 4 * a.max_tokens, 2)))
    med = statistics.median
    print(f"TP = 2, stories15m-shape target, {a.max_tokens} tokens, medians of {a.repeats}")
    print("| configuration | decode tok/s | step ms | rank 1 waiting for the plan, ms per step | share of the step |")
    print("|---|---|---|---|---|")
    for name, rs in (("no speculation", plain), (f"draft on rank 0, k = {a.k}", spec)):
        tok_s, wait, per_step = med(r[0] for r in rs), med(r[1] for r in rs), med(r[2] for r in rs)
        step_ms = 1000 * per_step / tok_s  # a step gives 1 + accepted tokens
        print(f"| {name} | {tok_s:.1f} | {step_ms:.2f} | {wait:.2f} | {100 * wait / step_ms:.0f}% |")
    ratio = [p / s for p, s in zip(pair, alone)]
    print(f"\ndraft decoding alone: {med(alone):.0f} tok/s; two copies at once: {med(pair):.0f} tok/s each "
          f"({med(ratio):.2f}x; per round {min(ratio):.2f}-{max(ratio):.2f}x)")


if __name__ == "__main__":
    main()
