#!/usr/bin/env python3
"""Constrained speculation is lossless on the real instruct model: greedy `specula generate --prompts-file`
output under every proposer equals plain constrained greedy output, token for token.

The requests are bench/structured_eval.py's (its scenario bank and user messages over the schemas of
tests/data/schemas, its system message, chat template applied with --chat), each line asking for its
schema as response_format json_schema, strict. Greedy (temperature 0). Configurations:

  SmolLM2-135M-Instruct Q4_1, against `--spec-method none --grammar-drafts 0 --max-num-seqs 1`:
    forced drafts alone (--spec-method none), ngram, suffix, suffix with --num-spec-tokens auto, and
    ngram with --grammar-drafts 0 (the proposer alone), each at --max-num-seqs 1 and 32; and suffix
    at --max-num-seqs 32 with max_tokens just past the longest reference output and a KV pool that
    holds the longest request and one block more, so that requests are preempted and recomputed (at
    least one preemption is required);
  its F32 conversion, against `--spec-method none --grammar-drafts 0 --max-num-seqs 1`:
    --spec-method self-quant (the target requantized to q4_0 as the draft) at --max-num-seqs 1 and 32.

Prints a table (configuration, requests, equal / total, forced drafts / accepted, proposer drafts cut by
the grammar, preemptions, generated tokens, wall and CPU s), how many reference outputs the grammar ended, the
machine and the date. Exits 1 on any difference (the first differing request is printed with both
texts), an error line, or a preemption run without preemptions.

  python3 bench/structured_spec_equal.py [--prompts 50] [--max-tokens 512] [--binary PATH] [--quick]

--quick (or SPECULA_QUICK=1), for CI: 3 prompts (the F32 runs 1), one batch size per configuration.
A quick run on a sanitizer build (SPECULA_SANITIZER) exits 77, which CTest reports as skipped: the
engine's own constrained-speculation tests (tests/engine/constrained_test.cc) run there on the
TinyStories model, and SmolLM2's forwards under ASan take minutes.
"""
import argparse
import datetime
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import structured_eval  # noqa: E402  (its scenarios, messages and model path; it imports serving_util)
import serving_util  # noqa: E402

CACHE = os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula"))
MODELS = {"Q4_1": structured_eval.SMOLLM2,
          "F32": os.path.join(CACHE, "smollm2", "SmolLM2-135M-Instruct.F32.gguf")}
REFERENCE = ["--spec-method", "none", "--grammar-drafts", "0"]
NGRAM = ["--spec-method", "ngram", "--num-spec-tokens", "4"]
SUFFIX = ["--spec-method", "suffix", "--num-spec-tokens", "4"]
AUTO = ["--spec-method", "suffix", "--num-spec-tokens", "auto", "--cost-cache", "none"]
SELF_QUANT = ["--spec-method", "self-quant", "--num-spec-tokens", "4"]
PREEMPT = "preempt"  # max_tokens and the KV pool come from the reference's lengths (preemption_flags)


def configurations(quick):
    """(name, model, flags, max-num-seqs); each model's reference first."""
    q4 = [("forced drafts (none)", ["--spec-method", "none"]), ("ngram", NGRAM), ("suffix", SUFFIX),
          ("suffix auto", AUTO), ("ngram, --grammar-drafts 0", NGRAM + ["--grammar-drafts", "0"])]
    # Quick: one batch size each, n-gram through its run without forced drafts.
    quick_batch = {"forced drafts (none)": 32, "suffix": 1, "suffix auto": 32, "ngram, --grammar-drafts 0": 32}
    rows = [("reference", "Q4_1", REFERENCE, 1)]
    rows += [(name, "Q4_1", flags, batch) for batch in (1, 32) for name, flags in q4
             if not quick or quick_batch.get(name) == batch]
    rows.append(("suffix, preempted", "Q4_1", SUFFIX + [PREEMPT], 32))
    rows.append(("reference", "F32", REFERENCE, 1))
    rows += [("self-quant q4_0", "F32", SELF_QUANT, batch) for batch in ((32,) if quick else (1, 32))]
    return rows


def write_prompts(path, schema_dir, count):
    files = sorted(glob.glob(os.path.join(schema_dir, "*.json")))
    if not files:
        sys.exit(f"no *.json schema in {schema_dir}")
    schemas = {os.path.splitext(os.path.basename(f))[0]: json.load(open(f)) for f in files}
    names = list(schemas)
    with open(path, "w") as f:
        for i in range(count):
            name = names[i % len(names)]
            message = structured_eval.user_message(name, schemas[name], i // len(names))
            fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schemas[name], "strict": True}}
            f.write(json.dumps({"id": i, "prompt": message, "response_format": fmt}) + "\n")


def generate(args, model, flags, batch, prompts):
    """The run's output lines by id, its wall time and its CPU time (user and system)."""
    cmd = [args.binary, "generate", "--model", MODELS[model], "--chat", "--system", structured_eval.SYSTEM,
           "--prompts-file", prompts, "--no-progress", "--temperature", "0", "--max-num-seqs", str(batch),
           *([] if "--max-tokens" in flags else ["--max-tokens", str(args.max_tokens)]), *flags]
    t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu1 = time.time() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {line["id"]: line for line in lines}, wall, cpu


def preemption_flags(reference, max_tokens, block_size=16):
    """max_tokens just past the longest reference output (an output its grammar ended is the same
    under it; one that max_tokens cut keeps max_tokens), and a KV pool that holds the longest request
    under it and one block more: the requests outgrow it together and are preempted."""
    cap = min(max_tokens, max(len(line.get("token_ids", [])) for line in reference.values()) + block_size)
    longest = max(line.get("prompt_tokens", 0) for line in reference.values()) + cap
    return ["--max-tokens", str(cap), "--num-blocks", str(-(-longest // block_size) + 1)]


def first_difference(name, reference, lines):
    """A description of the first request whose tokens differ from the reference's (or that failed)."""
    for i, ref in sorted(reference.items()):
        got = lines.get(i, {"error": "no output line"})
        if "error" in got:
            return f"[{name}] request {i}: {got['error']}"
        if got["token_ids"] != ref["token_ids"]:
            a, b = ref["token_ids"], got["token_ids"]
            at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            return (f"[{name}] request {i} differs at token {at} ({len(a)} tokens against {len(b)}):\n"
                    f"  reference: {ref['text']!r}\n  this run:  {got['text']!r}")
    return None


def row(name, model, batch, reference, lines, wall, cpu):
    spec = [line.get("spec", {}) for line in lines.values()]
    equal = sum(1 for i, ref in reference.items()
                if "token_ids" in lines.get(i, {}) and lines[i]["token_ids"] == ref["token_ids"])
    return {"name": f"{model} {name}, batch {batch}", "requests": len(lines), "equal": equal,
            "total": len(reference), "forced": sum(s.get("forced_draft_tokens", 0) for s in spec),
            "forced_accepted": sum(s.get("forced_accepted_tokens", 0) for s in spec),
            "cut": sum(s.get("grammar_cut_tokens", 0) for s in spec),
            "preemptions": sum(line.get("preemptions", 0) for line in lines.values()),
            "generated": sum(len(line.get("token_ids", [])) for line in lines.values()), "wall": wall, "cpu": cpu}


def run_all(args, prompts):
    """Every configuration (`prompts`: each model's prompts file): the table's rows and the failures."""
    rows, failures, references = [], [], {}
    for name, model, flags, batch in configurations(args.quick):
        preempted = PREEMPT in flags
        if preempted:
            flags = [f for f in flags if f != PREEMPT] + preemption_flags(references[model], args.max_tokens)
        lines, wall, cpu = generate(args, model, flags, batch, prompts[model])
        if name == "reference":
            references[model] = lines  # its error lines fail below
        r = row(name, model, batch, references[model], lines, wall, cpu)
        rows.append(r)
        print(f"{r['name']}: {r['equal']}/{r['total']} equal, {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
        diff = first_difference(r["name"], references[model], lines)
        if diff:
            failures.append(diff)
        if preempted and r["preemptions"] == 0:
            failures.append(f"[{r['name']}] no request was preempted: the pool is too large")
    return rows, failures, references


def report(args, rows, references):
    print(f"\nmachine: {structured_eval.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"SmolLM2-135M-Instruct; {args.prompts} chat requests (F32: {len(references['F32'])}) over the schemas "
          f"of {os.path.relpath(args.schema_dir, ROOT)}, response_format json_schema strict, greedy, "
          f"max_tokens {args.max_tokens}")
    for model, lines in references.items():
        ended = sum(1 for line in lines.values() if line.get("finish_reason") == "stop")
        print(f"{model} reference: {ended}/{len(lines)} ended by the grammar")
    print("\n| configuration | requests | equal / total | forced drafts / accepted | cut tokens | preemptions "
          "| generated tokens | wall s | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['requests']} | {r['equal']}/{r['total']} | {r['forced']} / {r['forced_accepted']} "
              f"| {r['cut']} | {r['preemptions']} | {r['generated']} | {r['wall']:.1f} | {r['cpu']:.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=serving_util.BINARY)
    p.add_argument("--prompts", type=int, default=None, help="requests (default 50; 3 with --quick)")
    p.add_argument("--max-tokens", type=int, default=512, help="as bench/structured_eval.py")
    p.add_argument("--schema-dir", default=os.path.join(ROOT, "tests", "data", "schemas"))
    p.add_argument("--quick", action="store_true", default=os.environ.get("SPECULA_QUICK") == "1")
    args = p.parse_args()
    if args.prompts is None:
        args.prompts = 3 if args.quick else 50
    if args.quick and serving_util.SANITIZER:
        print(f"SKIPPED: a quick run on a {serving_util.SANITIZER} build (see the top of this file)")
        return 77
    for path in MODELS.values():
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/fetch_models.sh")
    with tempfile.TemporaryDirectory() as d:
        prompts = {model: os.path.join(d, model + ".jsonl") for model in MODELS}
        write_prompts(prompts["Q4_1"], args.schema_dir, args.prompts)
        # The F32 target is four times the bytes a token reads: a quick run gives it the first one.
        write_prompts(prompts["F32"], args.schema_dir, min(args.prompts, 1) if args.quick else args.prompts)
        rows, failures, references = run_all(args, prompts)
    report(args, rows, references)
    for f in failures:
        print("FAIL " + f)
    print("FAIL" if failures else "PASS: every configuration's output equals its reference token for token")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
