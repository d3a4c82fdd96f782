#!/usr/bin/env python3
"""The degrade path under overload (`specula serve --degrade faq`), on SmolLM2-135M-Instruct Q8_0
over HTTP, with bench-serve as the client.

1. Capacity: all of --capacity-prompts requests at once, on a server without admission limits.
2. The SLO: Poisson arrivals at 80% of capacity for --seconds; the P99 TTFT measured there is the
   --ttft-slo-ms of the runs that follow.
3. Overload: Poisson arrivals at 3x capacity for --seconds, 20% of requests at priority 0 (never
   shed) and the rest at 1, a quarter of all of them questions from the FAQ file. The same schedule
   runs with --degrade faq and with --degrade refuse, alternating (--reps each), each on a fresh
   server, since the breaker's window would carry one run into the next.

Reports per run: requests answered by each path (model, faq, refused), the priority-0 P99 TTFT,
the FAQ answers' time at the server (specula:faq_answer_seconds: P99 as its bucket's upper bound,
and the largest bucket holding any) and at the client. Goals: FAQ answers under 5 ms at P99 at the
server; priority-0 P99 TTFT with degrade on at most 1.1x that with it off (median over the reps).

  python3 bench/degrade_eval.py [--binary build/release/specula] [--seconds 20] [--reps 3]
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests/serving/python"))
import serving_util  # noqa: E402
from serving_util import p99  # noqa: E402

MODEL = os.path.expanduser("~/.cache/specula/smollm2/SmolLM2-135M-Instruct.Q8_0.gguf")
TOPICS = ["password", "invoice", "refund", "delivery", "account", "subscription", "address", "warranty",
          "order", "card", "coupon", "return", "login", "email", "phone", "plan", "receipt", "gift card",
          "parcel", "membership"]
FAQ = [{"question": f"How do I change my {t}?",
        "answer": f"Sign in, open Settings, choose {t.title()}, and follow the steps on the page."}
       for t in TOPICS]
OTHER = [f"My {t} from last {d} has a problem: {p}. What should I do next?"
         for t in TOPICS for d in ("week", "month") for p in ("it never arrived", "it shows the wrong amount")]


def dataset(path, n, seed, max_tokens):
    """n lines: 20% priority 0, a quarter FAQ questions (independently), max_tokens each."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            faq = rng.random() < 0.25
            q = rng.choice(FAQ)["question"] if faq else rng.choice(OTHER)
            f.write(json.dumps({"prompt": q, "max_tokens": max_tokens, "ignore_eos": True,
                                "priority": 0 if rng.random() < 0.2 else 1}) + "\n")


def bench(binary, base, out, *flags):
    subprocess.run([binary, "bench-serve", "--endpoint", base, "--no-progress", "--result-json", out,
                    "--save-detailed", *map(str, flags)], check=True, capture_output=True, text=True, timeout=900)
    with open(out) as f:
        return json.load(f)


def faq_server_ms(m):
    """(P99 as the upper bound of the bucket holding it, the largest bucket bound holding any), ms."""
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in m.items() if k[0] == "specula:faq_answer_seconds_bucket")
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return float("nan"), float("nan")
    p = next(le for le, c in buckets if c >= 0.99 * total)
    top = next(le for le, c in buckets if c >= total)
    return p * 1000, top * 1000


def overload_run(binary, mode, slo_ms, faq_path, data, rate, n, seed):
    flags = ["--ttft-slo-ms", f"{slo_ms:.0f}", "--degrade", mode] + (["--faq", faq_path] if mode == "faq" else [])
    with serving_util.Serve(*flags, model=MODEL, tokenizer=None, ready_timeout=180) as s, \
            tempfile.TemporaryDirectory() as d:
        r = bench(binary, s.http_base, os.path.join(d, "o.json"), "--dataset-path", data, "--num-prompts", n,
                  "--request-rate", f"{rate:.3f}", "--seed", seed)
        m = serving_util.metrics(s.http_base)
        s.stop()
    lines = [json.loads(x) for x in open(data)]
    prio = [lines[i % len(lines)]["priority"] for i in range(len(r["outcomes"]))]
    ok0 = [t * 1000 for t, o, p in zip(r["ttfts"], r["outcomes"], prio) if o == "ok" and p == 0]
    faq_client = [t * 1000 for t, o, a in zip(r["ttfts"], r["outcomes"], r["request_answered_by"])
                  if o == "ok" and a == "faq"]
    server_p99, server_max = faq_server_ms(m)
    return {"mode": mode, "requests": len(r["outcomes"]), "model": r["answered_by"].get("model", 0),
            "faq": r["answered_by"].get("faq", 0), "refused": r["rejected"], "failed": r["failed"],
            "p99_ttft_priority0_ms": p99(ok0), "priority0_ok": len(ok0),
            "faq_server_p99_ms": server_p99, "faq_server_max_bucket_ms": server_max,
            "faq_client_p99_ms": p99(faq_client)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/release/specula"))
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--capacity-prompts", type=int, default=96)
    args = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL}: missing; run scripts/fetch_models.sh")
    with tempfile.TemporaryDirectory() as d:
        faq_path, data = os.path.join(d, "faq.jsonl"), os.path.join(d, "load.jsonl")
        with open(faq_path, "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in FAQ))
        dataset(data, 4000, 1, args.max_tokens)
        with serving_util.Serve(model=MODEL, tokenizer=None, ready_timeout=180) as s:
            cap = bench(args.binary, s.http_base, os.path.join(d, "c.json"), "--dataset-path", data,
                        "--num-prompts", args.capacity_prompts)
            capacity = cap["request_throughput"]
            slo_run = bench(args.binary, s.http_base, os.path.join(d, "s.json"), "--dataset-path", data,
                            "--num-prompts", int(0.8 * capacity * args.seconds), "--request-rate",
                            f"{0.8 * capacity:.3f}", "--seed", 2)
            slo_ms = slo_run["p99_ttft_ms"]
            s.stop()
        print(f"capacity {capacity:.2f} req/s; P99 TTFT at 80%: {slo_ms:.0f} ms (the SLO)", flush=True)
        n = int(3 * capacity * args.seconds)
        runs = []
        for rep in range(args.reps):
            for mode in ("faq", "refuse") if rep % 2 == 0 else ("refuse", "faq"):
                r = overload_run(args.binary, mode, slo_ms, faq_path, data, 3 * capacity, n, 10 + rep)
                r["rep"] = rep
                runs.append(r)
                print(json.dumps(r), flush=True)
    print(f"\nMachine: {serving_util.machine()}, {datetime.date.today()}. SmolLM2-135M-Instruct Q8_0, HTTP, "
          f"capacity {capacity:.2f} req/s, SLO {slo_ms:.0f} ms, {n} requests at 3x ({3 * capacity:.2f} req/s)\n")
    print("| rep | --degrade | requests | model | faq | refused | failed | priority-0 P99 TTFT (ms) | "
          "FAQ at the server, P99 (ms, bucket bound) | FAQ at the client, P99 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['rep']} | {r['mode']} | {r['requests']} | {r['model']} | {r['faq']} | {r['refused']} | "
              f"{r['failed']} | {r['p99_ttft_priority0_ms']:.0f} | "
              f"{r['faq_server_p99_ms']:.1f} (max {r['faq_server_max_bucket_ms']:.1f}) | {r['faq_client_p99_ms']:.1f} |")
    on = statistics.median(r["p99_ttft_priority0_ms"] for r in runs if r["mode"] == "faq")
    off = statistics.median(r["p99_ttft_priority0_ms"] for r in runs if r["mode"] == "refuse")
    server = max(r["faq_server_p99_ms"] for r in runs if r["mode"] == "faq")
    ratio = on / off
    print(f"\npriority-0 P99 TTFT, median over reps: degrade on {on:.0f} ms, off {off:.0f} ms: {ratio:.2f}x "
          f"(goal <= 1.1x); FAQ answers' P99 at the server <= {server:.1f} ms in every run (goal < 5 ms)")
    print(json.dumps({"capacity": capacity, "slo_ms": slo_ms, "ratio": ratio, "runs": runs}))
    return 0 if ratio <= 1.1 and server < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
