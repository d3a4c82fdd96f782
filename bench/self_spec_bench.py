#!/usr/bin/env python3
"""Self-speculation on a real chat model at batch 1: layer-skip (several N), self-quant and n-gram
against plain decoding, on the same chat prompts, interleaved in one run.

  python3 bench/self_spec_bench.py --specula build/release/specula --model SmolLM2-135M-Instruct.Q8_0.gguf \
      [--layers 4 8 15] [--quant q4_0] [--k 4] [--tokens 128] [--repeats 2]

Each configuration runs `specula generate --chat` greedy on every prompt (speculative greedy output
is the plain output, token for token: checked here too) and reads its decode tokens/s and mean
acceptance length. Prints one JSON line per run and a table of medians; speedup is against plain
decoding of the same prompt in the same round.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain why the sky is blue in three sentences.",
    "List five tips for writing clean code.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet.",
    "Give me a recipe for pancakes.",
]


def run(exe, model, prompt, tokens, extra):
    r = subprocess.run([exe, "generate", "--model", model, "--chat", "--prompt", prompt, "--max-tokens", str(tokens),
                        "--temperature", "0", *extra], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit("specula %s failed: %s" % (" ".join(extra), r.stderr.strip()))
    tps = float(re.search(r"decode: ([0-9.]+) tokens/s", r.stderr).group(1))
    m = re.search(r"mean acceptance length ([0-9.]+)", r.stderr)
    return r.stdout, tps, float(m.group(1)) if m else 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specula", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 15])
    ap.add_argument("--quant", nargs="+", default=["q4_0"])
    ap.add_argument("--k", default="4", help="--num-spec-tokens (a number or auto)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    configs = [("plain", [])]
    configs += [("layer-skip N=%d" % n, ["--spec-method", "layer-skip", "--draft-layers", str(n)]) for n in a.layers]
    configs += [("self-quant %s" % q, ["--spec-method", "self-quant", "--draft-quant-type", q]) for q in a.quant]
    configs += [("ngram", ["--spec-method", "ngram"])]
    speedups, tok_s, lengths = {}, {}, {}
    for rep in range(a.repeats):
        for p in PROMPTS:
            base_text, base_tps = None, None
            for name, extra in configs:
                if extra:
                    extra = extra + ["--num-spec-tokens", a.k]
                text, tps, length = run(a.specula, a.model, p, a.tokens, extra)
                if base_text is None:
                    base_text, base_tps = text, tps
                elif text != base_text:
                    raise SystemExit("%s changed the greedy output of %r" % (name, p))
                speedups.setdefault(name, []).append(tps / base_tps)
                tok_s.setdefault(name, []).append(tps)
                lengths.setdefault(name, []).append(length)
                print(json.dumps({"config": name, "prompt": p[:40], "repeat": rep, "decode_tok_s": tps,
                                  "mean_acceptance_length": length}), flush=True)
    print("\n| method | mean acceptance length | decode tok/s | speedup vs plain |")
    print("|---|---|---|---|")
    for name, _ in configs:
        print("| %s | %.2f | %.1f | %.2fx |" % (name, statistics.median(lengths[name]), statistics.median(tok_s[name]),
                                               statistics.median(speedups[name])))


if __name__ == "__main__":
    sys.exit(main())
