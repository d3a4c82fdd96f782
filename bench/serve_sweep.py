#!/usr/bin/env python3
"""Request-rate sweep of `specula serve` with `specula bench-serve` (gRPC, loopback), speculation off,
fixed k and auto, on a random-weight model of the stories15m shape (`specula make-model`).

Prints a markdown table of P99 TTFT / P99 TPOT / output tok/s against rate, and the knee of each
configuration: the last rate before P99 TTFT first exceeds --knee-ttft-ms. Speculation is n-gram
prompt lookup: a random-weight model's greedy text repeats, so lookup drafts are mostly accepted.

  python3 bench/serve_sweep.py [--rates 4,8,...] [--seconds 12] [--repeats 3] [--out results.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BINARY = os.path.join(ROOT, "build/release/specula")
CONFIGS = {
    "off": [],
    "ngram k=4": ["--spec-method", "ngram", "--num-spec-tokens", "4"],
    "ngram auto": ["--spec-method", "ngram", "--num-spec-tokens", "auto"],
}


def serve(model, extra):
    p = subprocess.Popen([BINARY, "serve", "--model", model, "--grpc-port", "0", "--http-port", "0",
                          "--max-num-seqs", "32", *extra], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"on grpc (\S+) and http", line)
        if m:
            return p, m.group(1)
    raise RuntimeError(f"serve exited with {p.wait()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="4,8,10,12,14,16,20")
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--knee-ttft-ms", type=float, default=500)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="which of: " + ", ".join(CONFIGS))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    configs = {c: CONFIGS[c] for c in args.configs.split(",")}
    tmp = tempfile.mkdtemp(prefix="specula_sweep_")
    model = os.path.join(tmp, "stories15m")
    subprocess.run([BINARY, "make-model", "--shape", "stories15m", "--out", model], check=True, capture_output=True)
    # All servers up at once (an idle one costs no CPU); each repeat runs every rate and every
    # configuration back to back, so the machine's noise falls on all of them alike; the table
    # gives the median of the repeats.
    servers = {name: serve(model, extra) for name, extra in configs.items()}
    runs = {}
    try:
        for name, (proc, target) in servers.items():
            # Warm-up: the cost model of auto measures its larger shapes between the first steps.
            subprocess.run([BINARY, "bench-serve", "--endpoint", f"grpc://{target}", "--num-prompts", "32",
                            "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--no-progress"],
                           check=True, capture_output=True)
        for rep in range(args.repeats):
            for rate in rates:
                for name, (proc, target) in servers.items():
                    out = os.path.join(tmp, "r.json")
                    n = max(32, int(rate * args.seconds))
                    subprocess.run([BINARY, "bench-serve", "--endpoint", f"grpc://{target}", "--num-prompts", str(n),
                                    "--request-rate", str(rate), "--input-len", str(args.input_len), "--output-len",
                                    str(args.output_len), "--seed", str(rep + 1), "--no-progress", "--result-json", out],
                                   check=True, capture_output=True)
                    with open(out) as f:
                        r = json.load(f)
                    runs.setdefault(name, {}).setdefault(rate, []).append(r)
                    print(f"{name:>11} rate {rate:5.1f} #{rep}: P99 TTFT {r['p99_ttft_ms']:8.1f} ms, "
                          f"P99 TPOT {r['p99_tpot_ms']:6.1f} ms, {r['output_throughput']:7.1f} tok/s", file=sys.stderr)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    keys = ("p99_ttft_ms", "p99_tpot_ms", "output_throughput")
    results = {c: {rate: {k: statistics.median(r[k] for r in rs) for k in keys} for rate, rs in by_rate.items()}
               for c, by_rate in runs.items()}
    print("| rate (req/s) | " + " | ".join(f"{c}: P99 TTFT / P99 TPOT (ms), tok/s" for c in configs) + " |")
    print("|---|" + "---|" * len(configs))
    for rate in rates:
        cells = []
        for c in configs:
            r = results[c][rate]
            cells.append(f"{r['p99_ttft_ms']:.0f} / {r['p99_tpot_ms']:.1f}, {r['output_throughput']:.0f}")
        print(f"| {rate:g} | " + " | ".join(cells) + " |")
    # The knee: the last rate before P99 TTFT first exceeds the bound (the queue starts to grow).
    for c in configs:
        knee = None
        for rate in rates:
            if results[c][rate]["p99_ttft_ms"] > args.knee_ttft_ms:
                break
            knee = rate
        print(f"knee of {c} (last rate before P99 TTFT > {args.knee_ttft_ms:g} ms): "
              f"{'below ' + str(rates[0]) if knee is None else knee} req/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({c: {str(k): v for k, v in r.items()} for c, r in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
