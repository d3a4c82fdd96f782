#!/usr/bin/env python3
"""Grammar-forced drafts on a JSON FAQ workload (experiments/workloads/faq_json.jsonl): where a
constrained request's grammar allows one continuation only (a key name, `", "`, a closing brace),
those tokens are drafts the target verifies in the same forward. Six configurations of
`specula generate --prompts-file` (real processes, greedy, --chat, the same flags otherwise):

  C0   constrained, --spec-method none --grammar-drafts 0   (plain constrained decoding)
  CF   constrained, --spec-method none                      (grammar drafts on)
  CS   constrained, --spec-method suffix --grammar-drafts 0
  CSF  constrained, --spec-method suffix                    (grammar drafts on)
  U0   the same prompts without their constraint, --spec-method none
  US   the same prompts without their constraint, --spec-method suffix

run in paired rounds (each round runs every configuration once, the order turning each round).
Tokens/s is the engine's own figure (generated tokens over the run's engine time, on stderr).
Prints a markdown table of medians (min-max over rounds): tokens/s, the share of output tokens that
came from forced drafts (forced_accepted / generated) and their acceptance (forced_accepted /
forced_draft_tokens), and per-round ratios: CSF/CS (goal >= 1.2), CF/C0, CSF/C0, US/U0 and the share
of unconstrained speculation's gain kept, (CSF/C0) / (US/U0) (goal >= 0.9). Exits 1 when an output
differs from C0's (constrained) or U0's (unconstrained) token for token, or a run fails.

  python3 bench/grammar_drafts_eval.py [--rounds 5] [--num-spec-tokens 8] [--max-tokens 160]
      [--binary build/release/specula] [--model SmolLM2-135M-Instruct.Q4_1.gguf]
      [--workload experiments/workloads/faq_json.jsonl] [--whitespace compact|any] [--configs C0,U0,US]

--whitespace compact (the default) asks for compact JSON (structured_outputs' disable_any_whitespace:
separators ", " and ": " and no other blanks), so that whole strings like `", "needs_human_agent": `
are forced; any keeps the workload's response_format as it is. SPECULA_QUICK=1 runs 2 rounds.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import structured_eval  # noqa: E402  (bench/: the machine's name and the model's path)

ROOT = structured_eval.ROOT
CONFIGS = {  # name: (constrained, spec method, grammar drafts on)
    "C0": (True, "none", False), "CF": (True, "none", True), "CS": (True, "suffix", False),
    "CSF": (True, "suffix", True), "U0": (False, "none", False), "US": (False, "suffix", False)}
SUMMARY = re.compile(r"\[specula\] \d+ requests \(\d+ rejected\), \d+ generated tokens in [\d.]+ s: ([\d.]+) tok/s")
CONSTRAINT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_grammar",
                     "grammar", "json_schema", "guided_choice")


def write_workloads(src, tmp, whitespace):
    """The constrained and unconstrained prompts files: (constrained path, unconstrained path)."""
    lines = [json.loads(t) for t in open(src) if t.strip()]
    constrained, plain = [], []
    for line in lines:
        bare = {k: v for k, v in line.items() if k not in CONSTRAINT_FIELDS}
        plain.append(bare)
        rf = line.get("response_format", {})
        if whitespace == "compact" and rf.get("type") == "json_schema":
            line = dict(bare, structured_outputs={"json": rf["json_schema"]["schema"], "disable_any_whitespace": True})
        constrained.append(line)
    paths = []
    for name, rows in (("constrained.jsonl", constrained), ("unconstrained.jsonl", plain)):
        paths.append(os.path.join(tmp, name))
        with open(paths[-1], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return paths


def has_grammar_drafts(binary):
    r = subprocess.run([binary, "generate", "--help"], capture_output=True, text=True)
    return "--grammar-drafts" in r.stdout + r.stderr


def run(args, name, prompts_file, flag_known):
    constrained, method, drafts_on = CONFIGS[name]
    cmd = [args.binary, "generate", "--model", args.model, "--chat", "--prompts-file", prompts_file, "--max-tokens",
           str(args.max_tokens), "--temperature", "0", "--max-num-seqs", str(args.max_num_seqs), "--no-progress",
           "--spec-method", method]
    if method != "none":
        cmd += ["--num-spec-tokens", str(args.num_spec_tokens)]
    if constrained and not drafts_on and flag_known:
        cmd += ["--grammar-drafts", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [json.loads(t) for t in r.stdout.splitlines() if t.startswith("{")]
    m = SUMMARY.search(r.stderr)
    if r.returncode != 0 or m is None or any("error" in j for j in lines):
        why = "\n".join(r.stderr.strip().splitlines()[:4])
        if "unknown flag --grammar-drafts" in why:
            why = "this build has no --grammar-drafts flag: grammar-forced drafts are not in it"
        elif "disable_any_whitespace" in why:
            why += "\n(this build does not take disable_any_whitespace: try --whitespace any)"
        sys.exit(f"{name} failed (exit {r.returncode}): {' '.join(cmd)}\n{why}")
    return {"tok_s": float(m.group(1)), "outs": {j["id"]: j for j in lines}}


def totals(result):
    """Generated tokens and the spec counters summed over a run's requests (None where absent)."""
    outs = result["outs"].values()
    t = {"generated": sum(len(o["token_ids"]) for o in outs),
         "stop": sum(o["finish_reason"] == "stop" for o in outs), "requests": len(outs)}
    for key in ("forced_draft_tokens", "forced_accepted_tokens", "draft_tokens", "accepted_tokens"):
        vals = [o.get("spec", {}).get(key) for o in outs]
        t[key] = None if any(v is None for v in vals) else sum(vals)
    return t


def mismatches(ref, result, name, rnd):
    found = []
    for rid, o in ref["outs"].items():
        got = result["outs"].get(rid, {}).get("token_ids")
        if got != o["token_ids"]:
            at = next((i for i, (a, b) in enumerate(zip(o["token_ids"], got or [])) if a != b),
                      min(len(o["token_ids"]), len(got or [])))
            found.append(f"round {rnd} {name} {rid}: differs from the reference at token {at} "
                         f"({len(got or [])} tokens against {len(o['token_ids'])})")
    return found


def fmt(values, form="{:.2f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}–{form.format(max(values))})"


def ratio(num, den):
    return None if num is None or not den else num / den


def report(args, names, rounds):
    per = {n: [r[n] for r in rounds if n in r] for n in names}
    tot = {n: [totals(x) for x in per[n]] for n in names}
    print(f"\nmachine: {structured_eval.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"command: {' '.join([sys.executable] + sys.argv)}")
    print(f"model: {os.path.basename(args.model)}; workload: {os.path.relpath(args.workload, ROOT)}, "
          f"{args.whitespace} whitespace; greedy, --max-tokens {args.max_tokens}, --max-num-seqs "
          f"{args.max_num_seqs}, suffix k = {args.num_spec_tokens}; {len(rounds)} rounds, medians (min–max)\n")
    print("| config | tok/s | generated tokens | ended by grammar | forced share of output | forced acceptance "
          "| drafts accepted / drafted |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        ts = tot[n]
        forced = [ratio(t["forced_accepted_tokens"], t["generated"]) for t in ts]
        accept = [ratio(t["forced_accepted_tokens"], t["forced_draft_tokens"]) for t in ts]
        suffix = [ratio(t["accepted_tokens"], t["draft_tokens"]) for t in ts] if CONFIGS[n][1] != "none" else []
        ended = f"{ts[0]['stop']}/{ts[0]['requests']}" if CONFIGS[n][0] else "–"
        print(f"| {n} | {fmt([x['tok_s'] for x in per[n]], '{:.1f}')} | {ts[0]['generated']} | {ended} "
              f"| {fmt(forced, '{:.1%}')} | {fmt(accept, '{:.1%}')} | {fmt(suffix, '{:.1%}')} |")
    speed = [{n: r[n]["tok_s"] for n in r} for r in rounds]

    def per_round(a, b):
        return [s[a] / s[b] for s in speed if a in s and b in s]
    kept = [(s["CSF"] / s["C0"]) / (s["US"] / s["U0"]) for s in speed if all(k in s for k in ("CSF", "C0", "US", "U0"))]
    print("\n| ratio of tokens/s, per round | median (min–max) | goal |")
    print("|---|---|---|")
    for label, values, goal in (("CSF / CS", per_round("CSF", "CS"), ">= 1.2"), ("CF / C0", per_round("CF", "C0"), ""),
                                ("CSF / C0", per_round("CSF", "C0"), ""), ("US / U0", per_round("US", "U0"), ""),
                                ("kept: (CSF / C0) / (US / U0)", kept, ">= 0.9")):
        print(f"| {label} | {fmt(values)} | {goal} |")


def main():
    quick = os.environ.get("SPECULA_QUICK") == "1"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=os.path.join(ROOT, "build/release/specula"))
    p.add_argument("--model", default=structured_eval.SMOLLM2)
    p.add_argument("--workload", default=os.path.join(ROOT, "experiments/workloads/faq_json.jsonl"))
    p.add_argument("--rounds", type=int, default=2 if quick else 5)
    p.add_argument("--num-spec-tokens", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--max-num-seqs", type=int, default=1, help="sequences per step (1: one request at a time)")
    p.add_argument("--whitespace", choices=["compact", "any"], default="compact")
    p.add_argument("--configs", default=",".join(CONFIGS), help="a comma list of " + ", ".join(CONFIGS))
    args = p.parse_args()
    names = [n for n in CONFIGS if n in args.configs.split(",")]
    if not names or len(names) != len(set(args.configs.split(","))):
        sys.exit(f"--configs: pick from {', '.join(CONFIGS)}")
    if not os.path.exists(args.model):
        sys.exit(f"{args.model} is missing: run scripts/fetch_models.sh")
    flag_known = has_grammar_drafts(args.binary)
    need = [n for n in names if n in ("CF", "CS", "CSF")]
    if not flag_known and need:
        sys.exit(f"{args.binary} has no --grammar-drafts flag: grammar-forced drafts are not in this build, so "
                 f"{', '.join(need)} cannot run (--configs C0,U0,US runs the others)")
    rounds, bad = [], []
    with tempfile.TemporaryDirectory() as tmp:
        files = write_workloads(args.workload, tmp, args.whitespace)
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            results = {}
            for n in order:
                results[n] = run(args, n, files[0 if CONFIGS[n][0] else 1], flag_known)
                print(f"round {rnd} {n}: {results[n]['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
            rounds.append(results)
            for n in names:  # the first round's C0 and U0 are the references
                ref = "C0" if CONFIGS[n][0] else "U0"
                if ref in rounds[0]:
                    bad += mismatches(rounds[0][ref], results[n], n, rnd)
    report(args, names, rounds)
    for line in bad:
        print("MISMATCH: " + line)
    print(f"FAIL: {len(bad)} outputs differ from their reference" if bad else "outputs: equal to C0's and U0's")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
