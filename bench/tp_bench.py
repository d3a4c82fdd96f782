#!/usr/bin/env python3
"""CPU tensor parallelism: TP = 2 (two MPI ranks, one thread each) against TP = 1 (one process with
one thread, and with two), single-prompt greedy decoding on random models of real shapes.

Prints, per model and configuration (medians of --repeats interleaved runs): decode tokens/s, the
step time, the share of the forward spent in collectives on rank 0 (all-reduces and the logits
all-gather, waiting for the slower rank included: SPECULA_COMM_STATS=1), and each rank's RSS.

usage: bench/tp_bench.py --specula build/release/specula [--shapes stories15m smollm2-135m]
                         [--max-tokens 128] [--repeats 3]
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def run(specula, model, tp, threads, max_tokens):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), SPECULA_COMM_STATS="1")
    cmd = MPIRUN + ["-x", "OMP_NUM_THREADS", "-x", "SPECULA_COMM_STATS", "-np", str(tp), specula, "generate",
                    "--model", model, "--prompt", "Once upon a time there was", "--max-tokens", str(max_tokens),
                    "--ignore-eos", "--tensor-parallel-size", str(tp)]
    err = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    m = re.search(r"prefill: [\d.]+ tokens/s \(([\d.]+) ms\), decode: ([\d.]+) tokens/s \(([\d.]+) ms\)", err)
    prefill_ms, tok_s, decode_ms = float(m.group(1)), float(m.group(2)), float(m.group(3))
    ranks = {}
    for r, ar, ag, rss in re.findall(r"rank (\d+) collectives: all_reduce \d+ calls ([\d.]+) s, all_gather \d+ calls "
                                     r"([\d.]+) s.*?RSS [\d.]+ MB \(peak ([\d.]+) MB\)", err):
        ranks[int(r)] = (float(ar) + float(ag), float(rss))
    comm_s, _ = ranks.get(0, (0.0, 0.0))
    share = comm_s * 1000 / (prefill_ms + decode_ms)
    return tok_s, share, [ranks[r][1] for r in sorted(ranks)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specula", default="build/release/specula")
    ap.add_argument("--shapes", nargs="+", default=["stories15m", "smollm2-135m"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    configs = [("TP=1, 1 thread", 1, 1), ("TP=1, 2 threads", 1, 2), ("TP=2, 1 thread/rank", 2, 1)]
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes:
            model = os.path.join(tmp, shape)
            subprocess.run([a.specula, "make-model", "--shape", shape, "--out", model, "--seed", "1"], check=True,
                           capture_output=True)
            results = {c[0]: [] for c in configs}
            for _ in range(a.repeats):  # interleaved: the machine's noise falls on every configuration
                for name, tp, threads in configs:
                    results[name].append(run(a.specula, model, tp, threads, a.max_tokens))
            base = statistics.median(r[0] for r in results[configs[0][0]])
            print(f"\n{shape} ({a.max_tokens} tokens, medians of {a.repeats})")
            print(f"| configuration | decode tok/s | step ms | vs TP=1, 1 thread | collectives share (rank 0) | peak RSS per rank MB |")
            print("|---|---|---|---|---|---|")
            for name, _, _ in configs:
                rs = results[name]
                tok_s = statistics.median(r[0] for r in rs)
                share = statistics.median(r[1] for r in rs)
                rss = [statistics.median(r[2][i] for r in rs) for i in range(len(rs[0][2]))]
                print(f"| {name} | {tok_s:.1f} | {1000 / tok_s:.2f} | {tok_s / base:.2f}x | {100 * share:.1f}% | "
                      f"{' / '.join(f'{x:.0f}' for x in rss)} |")


if __name__ == "__main__":
    main()
