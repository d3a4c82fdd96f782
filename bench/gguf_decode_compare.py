#!/usr/bin/env python3
"""Decode speed on GGUF files at batch 1: Specula against llama.cpp's llama-bench, same files, one run.

  python3 bench/gguf_decode_compare.py --specula build/release/specula \
      [--llama-bench PATH/llama-bench] [--threads 2] [--tokens 128] [--repeats 3] FILE.gguf...

For each file and repeat (interleaved, so that the shared machine's noise hits both engines alike)
it runs `specula generate` greedy (default two-term activations, then --int8-activations) for --tokens new tokens after a short prompt and reads its
"decode: X tokens/s" line, then `llama-bench -p 0 -n TOKENS -t THREADS` on the same file. It prints
one JSON line per run and a table of medians with the bytes each decoded token reads (every weight
matrix once, the tied classifier included) and the bandwidth that implies.

llama.cpp is not part of this repository: build its llama-bench yourself (README, "GGUF models").
"""
import argparse
import json
import re
import statistics
import subprocess
import sys

import gguf

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def weight_bytes(path):
    """Bytes of every weight a decode step reads: all tensors (a tied classifier reads the embedding)."""
    r = gguf.GGUFReader(path)
    total = sum(int(t.n_bytes) for t in r.tensors)
    tied = all(t.name != "output.weight" for t in r.tensors)
    # The embedding lookup reads one row; the classifier reads the whole table (once if tied).
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    return total if tied else total - int(embd.n_bytes)


def run_specula(exe, path, tokens, threads, extra=()):
    env = {"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([exe, "generate", "--model", path, "--prompt", PROMPT, "--max-tokens", str(tokens),
                        "--temperature", "0", "--ignore-eos", *extra], capture_output=True, text=True, env=env,
                       timeout=600)
    if r.returncode != 0:
        raise SystemExit("specula failed on %s: %s" % (path, r.stderr.strip()))
    m = re.search(r"decode: ([0-9.]+) tokens/s", r.stderr)
    return float(m.group(1))


def run_llama_bench(exe, path, tokens, threads):
    r = subprocess.run([exe, "-m", path, "-p", "0", "-n", str(tokens), "-t", str(threads), "-r", "1", "-o", "json"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit("llama-bench failed on %s: %s" % (path, r.stderr.strip()[-500:]))
    return float(json.loads(r.stdout)[0]["avg_ts"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--specula", required=True)
    ap.add_argument("--llama-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bandwidth-gbs", type=float, help="the machine's measured memory bandwidth, for the bound")
    a = ap.parse_args()
    results = {}
    for rep in range(a.repeats):
        for path in a.files:
            for impl in ("specula", "specula-int8", "llama.cpp"):
                if impl == "llama.cpp" and not a.llama_bench:
                    continue
                if impl == "llama.cpp":
                    tps = run_llama_bench(a.llama_bench, path, a.tokens, a.threads)
                else:
                    extra = ["--int8-activations"] if impl == "specula-int8" else []
                    tps = run_specula(a.specula, path, a.tokens, a.threads, extra)
                results.setdefault((path, impl), []).append(tps)
                print(json.dumps({"file": path, "impl": impl, "repeat": rep, "decode_tok_s": tps}), flush=True)
    print("\n| file | MB read per token | Specula tok/s | Specula --int8-activations tok/s | llama.cpp tok/s "
          "| Specula / llama.cpp | Specula GB/s |" + (" % of bandwidth |" if a.bandwidth_gbs else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if a.bandwidth_gbs else ""))
    for path in a.files:
        mb = weight_bytes(path) / 1e6
        s = statistics.median(results[(path, "specula")])
        s8 = statistics.median(results[(path, "specula-int8")])
        l = statistics.median(results[(path, "llama.cpp")]) if (path, "llama.cpp") in results else float("nan")
        gbs = s * mb / 1e3
        row = "| %s | %.1f | %.1f | %.1f | %.1f | %.2fx | %.1f |" % (path.split("/")[-1], mb, s, s8, l, s / l, gbs)
        if a.bandwidth_gbs:
            row += " %.0f%% |" % (100 * gbs / a.bandwidth_gbs)
        print(row)


if __name__ == "__main__":
    sys.exit(main())
