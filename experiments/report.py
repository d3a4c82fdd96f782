#!/usr/bin/env python3
"""The report of an experiment: `specula experiment run`'s results as markdown, plots and a capacity plan.

    python3 -m experiments.report DIR... [--out PATH] [--target-qps 10,100,1000] [--cost-per-hour 2.5]
    python3 experiments/report.py DIR ...

writes DIR/report.md (or --out) with PNG plots beside it and prints the report's path. Several DIRs
are the parts of one run (`experiment run --part I/N`): merge.py checks and merges them into --out's
directory, whose report is then written. Bad input
(a missing DIR, a missing or empty results.jsonl, a malformed line) is one line on stderr and exit
status 2. A last line without a newline that does not parse (a run killed mid-write) is skipped
with a warning.

The input, DIR/run.json and DIR/results.jsonl, is described in results.py.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    from experiments import merge, plots, results
except ImportError:  # run as a script: its own directory is on sys.path
    import merge, plots, results

DEFAULT_TARGET_QPS = (10.0, 100.0, 1000.0)
DEFAULT_COST_PER_HOUR = 2.5


# ----------------------------------------------------------------------------------------- markdown

fmt_value = results.fmt_value  # a parameter, as labels show it too


def fmt(v, spec=".1f", suffix=""):
    if v is None:
        return results.NOT_AVAILABLE
    try:
        return format(v, spec) + suffix
    except (TypeError, ValueError):
        return str(v)


def fmt_spread(v, r, spec=".1f", suffix=""):
    """A median with its spread over repeats, "210.0 (205.0–215.0)"; the median alone without one."""
    if v is None or not r or r[0] == r[1]:
        return fmt(v, spec, suffix)
    return f"{fmt(v, spec, suffix)} ({format(r[0], spec)}–{format(r[1], spec)}{suffix})"


def best_name(r, show_config):
    """The best configuration's name, or "no significant difference" where it does not beat none
    beyond the spread of the repeats."""
    name = r["config"] if show_config else r["label"]
    if r["significant"] is False:
        return f"no significant difference (by median: {name})"
    return name


def fmt_money(v):
    if v is None:
        return "n/a"
    return f"${v:.2f}" if v >= 0.01 else f"${v:.2g}"


def md_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _key(d, name):
    """A field of the spec's JSON under its proto name or its lowerCamel JSON name."""
    if not isinstance(d, dict):
        return None
    camel = name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
    return d.get(name, d.get(camel))


def describe_workload(w):
    if not isinstance(w, dict) or not w:
        return "unknown workload"
    synthetic, count = _key(w, "synthetic"), _key(w, "num_requests")
    conversation = _key(w, "conversation")
    if isinstance(conversation, dict):
        users = _key(conversation, "user_messages_file")
        text = (f"{fmt_value(_key(conversation, 'sessions'))} conversations of {fmt_value(_key(conversation, 'turns'))} "
                f"turns, {fmt_value(_key(conversation, 'session_concurrency') or 'all')} at a time, each turn sending "
                "the history, the answer received and a new user message "
                + (f"from `{users}`" if users else f"of {fmt_value(_key(conversation, 'user_words'))} random words"))
    elif isinstance(synthetic, dict):
        text = (f"synthetic prompts of {fmt_value(_key(synthetic, 'input_len'))} tokens generating "
                f"{fmt_value(_key(synthetic, 'output_len'))} tokens each")
    else:
        text = f"prompts from `{_key(w, 'prompts_file') or 'unknown file'}`"
    text += f", {fmt_value(count) if count is not None else 'the default number of'} requests"
    if _key(w, "max_tokens") is not None:
        text += f", max_tokens {fmt_value(_key(w, 'max_tokens'))}"
    if _key(w, "seed") is not None:
        text += f", seed {fmt_value(_key(w, 'seed'))}"
    if _key(w, "ignore_eos"):
        text += ", end-of-sequence ignored"
    return text


def describe_slo(slo):
    names = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency"))
    bounds = [f"P99 {title} ≤ {fmt_value(slo[k])} ms" for k, title in names if k in slo]
    return ", ".join(bounds) if bounds else "none (no latency bound)"


def assumptions(run, points, mode, slo, cost_per_hour):
    """The "Assumptions" paragraph: where, how and under which rules the figures were measured."""
    def get(name, default="unknown"):
        v = run.get(name)
        return default if v in (None, "") else v
    repeats = sorted({p["repeats"] for p in points})
    n = fmt_value(repeats[0]) if len(repeats) == 1 else f"{repeats[0]}–{repeats[-1]}"
    text = (f"Measured on {get('cpu')} ({get('threads')} threads, SIMD {get('simd')}, GPU {get('gpu', 'none')}), "
            f"{get('build_type')} build of commit `{get('git_commit')}`, on {get('date')}. "
            f"Mode {mode}: ")
    if mode == "ONLINE" and isinstance(_key(run.get("workload"), "conversation"), dict):
        text += "closed-loop conversations through the serving stack, each turn sent once the one before it is answered. "
    elif mode == "ONLINE":
        text += "requests arrive at each point's request_rate through the serving stack. "
    else:
        text += ("every request is added at t = 0, so TTFT measures the wait in the queue, not the service. ")
    text += (f"Workload: {describe_workload(run.get('workload'))}. SLO: {describe_slo(slo)}. "
             f"Every figure is the median over {n} repeat{'s' if repeats[-1] != 1 else ''} of its point "
             f"({len(points)} points). The capacity plan assumes {fmt_money(cost_per_hour)} per replica-hour.")
    if run.get("spec_path"):
        text += f" Spec: `{run['spec_path']}`."
    return text


def plots_section(made_plots, points):
    shown = ("temperature", "max_num_seqs") + results.SPEC_DIMS
    folded = [d for d in results.varying_dims(points) if d not in shown]
    lines = ["## Plots", ""]
    if folded:
        lines += [f"Against max_num_seqs, {', '.join(folded)} also var{'y' if len(folded) > 1 else 'ies'}: "
                  "each line shows, at each batch "
                  "size, the point with the highest output tok/s.", ""]
    for name, title, written in made_plots:
        if written:
            lines += [f"![{title}]({name})", ""]
        else:
            why = next(w for n, _, w in plots.PLOTS if n == name)
            lines += [f"No {name} plot: {why}.", ""]
    written = {name for name, _, ok in made_plots if ok}
    if "speedup_vs_batch.png" in written:
        lines += ["The speedup is output tok/s over that of the \"none\" point with the same other parameters.", ""]
    if "acceptance_by_position.png" in written:
        lines += ["Acceptance by position is pooled over each label's points (all batch sizes), weighted by "
                  "their drafts.", ""]
    return lines


def best_section(points):
    rows = results.best_per_batch_rows(points)
    show_config = any(r["config"] != r["label"] for r in rows)
    headers = ["max_num_seqs", "temperature", "best configuration", "output tok/s", "speedup over none",
               "P99 TPOT (ms)", "mean acceptance length"]
    table = [[fmt_value(r["max_num_seqs"]), fmt_value(r["temperature"]), best_name(r, show_config),
              fmt_spread(r["output_tok_s"], r["output_tok_s_range"]),
              fmt_spread(r["speedup"], r["speedup_range"], ".2f", "x"), fmt(r["tpot_p99_ms"]),
              fmt(r["mean_acceptance_length"], ".2f")] for r in rows]
    return ["## Best configuration per batch size", "", md_table(headers, table), "",
            "In parentheses: the spread over repeats (min–max; a speedup's from the slowest and fastest "
            "repeats of both). A configuration is named best only where its slowest repeat beats the "
            "fastest repeat without speculation (at least 2 repeats each); elsewhere the row says \"no "
            "significant difference\".", ""]


def results_section(points):
    rows = results.full_results_rows(points)
    dims = list(rows[0]["params"]) if rows else []
    head = [d for d in dims if d in ("temperature", "max_num_seqs")]  # the label goes where spec_method is
    show_completed = any(not results.completed_all(p) for p in points)
    show_goodput = any(r["goodput"] is not None for r in rows)  # results from before goodput have none
    headers = head + ["speculation"] + dims[len(head):]
    headers += ["output tok/s", "total tok/s", "TTFT P50", "TTFT P99", "TPOT P50", "TPOT P99", "E2E P50",
                "E2E P99", "mean acc. len", "peak KV", "preemptions"] + (["goodput"] if show_goodput else [])
    headers += ["completed"] if show_completed else []
    table = []
    for r in rows:
        params = [fmt_value(r["params"][d]) for d in dims]
        cells = params[:len(head)] + [r["label"]] + params[len(head):]
        cells += [fmt_spread(r["output_tok_s"], r["output_tok_s_range"]), fmt(r["total_tok_s"])]
        cells += [fmt(r[f"{n}_{w}_ms"]) for n in ("ttft", "tpot", "e2e") for w in ("p50", "p99")]
        cells += [fmt(r["mean_acceptance_length"], ".2f"),
                  fmt(None if r["peak_kv_usage"] is None else 100 * r["peak_kv_usage"], ".0f", "%"),
                  fmt_value(r["preemptions"])]
        if show_goodput:
            cells.append(fmt(None if r["goodput"] is None else 100 * r["goodput"], ".0f", "%"))
        if show_completed:
            cells.append(f"{fmt_value(r['completed'])}/{fmt_value(r['num_requests'])}")
        table.append(cells)
    note = "Latencies in ms."
    if show_goodput:
        note += (" Goodput: the share of requests that completed within every SLO bound, each request on its "
                 "own (with no bound, the share that completed).")
    lines = ["## All results", "", note, "", md_table(headers, table), ""]
    if show_completed:
        lines += ["\"completed\" is the median over repeats; a point where any repeat left a request "
                  "uncompleted (rejected or failed) counts for no capacity.", ""]
    return lines


def capacity_section(points, mode, slo, target_qps, cost_per_hour):
    lines = ["## Capacity plan", ""]
    if mode == "ONLINE":
        options = results.sustainable_qps(points, slo)
        lines += [f"A configuration (a point less its request_rate, burstiness and burst_factor) sustains an "
                  f"offered request rate when every request of every repeat completed (none rejected or failed) "
                  f"and its P99 latencies are within the SLO ({describe_slo(slo) if slo else 'no bound is set'}) "
                  f"at every burstiness and burst factor tried. Its replica QPS is the highest rate it "
                  f"sustains; \"inf\" rates are ignored."]
    else:
        options = results.offline_qps(points, slo)
        tpot = f"P99 TPOT ≤ {fmt_value(slo['tpot_ms'])} ms" if "tpot_ms" in slo else "no TPOT bound"
        lines += [f"OFFLINE: every request arrived at t = 0, so TTFT (and E2E) measure the queue and are not "
                  f"applied. The replica QPS is the request throughput of the best point that completed every "
                  f"request with {tpot}. **This is an upper bound**: requests arriving over time must also "
                  f"meet the TTFT bound; an ONLINE spec with a request_rate sweep gives the real plan."]
    lines += ["", f"Replicas = ceil(target QPS / replica QPS); cost per million output tokens = replicas × "
              f"{fmt_money(cost_per_hour)}/h ÷ (target QPS × mean output tokens per request × 3600) × 10⁶, "
              "with the configuration's mean output tokens per request (output tokens / completed).", ""]
    plan = results.capacity_plan(options, target_qps, cost_per_hour)
    if plan and plan[0]["replicas"] is None:
        lines += ["**No configuration meets the SLO**: no replica count can be given.", ""]
    lines += [md_table(["target QPS", "replica QPS", "configuration", "replicas", "$ per M output tokens"],
                       [[fmt_value(r["target_qps"]), "n/a" if r["replica_qps"] is None else f"{r['replica_qps']:g}",
                         r["config"] or "n/a", "n/a" if r["replicas"] is None else r["replicas"],
                         fmt_money(r["cost_per_million"])] for r in plan]), ""]
    lines += ["Per configuration:", "",
              md_table(["configuration", "replica QPS", "output tok/s", "P99 TTFT (ms)", "P99 TPOT (ms)"],
                       [[o["config"], "none within the SLO" if o["qps"] is None else f"{o['qps']:g}",
                         fmt(o["point"].get("output_tok_s")), fmt(results.stat(o["point"], "ttft_ms", "p99")),
                         fmt(results.stat(o["point"], "tpot_ms", "p99"))] for o in options]), ""]
    return lines


def _binary():
    return os.environ.get("SPECULA_BINARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                            "build", "release", "specula")


def _acceptance(records, key):
    """A point's acceptance by position, averaged over its repeats (results.jsonl's raw lines)."""
    sums, n = [], 0
    for r in records:
        per = (r.get("spec") or {}).get("acceptance_per_position") if r["key"] == key else None
        if per:
            sums = [a + b for a, b in zip(sums + [0.0] * (len(per) - len(sums)), per)]
            n += 1
    return [v / n for v in sums] if n else []


def _candidates(directory, points, calibration, cost_per_hour):
    """One `specula plan` candidate per configuration (a point less its load), from the calibration."""
    seen, out = set(), []
    records = results.load_results(os.path.join(directory, "results.jsonl"))
    for p in points:
        key = results.config_key(p, ("request_rate", "burstiness", "burst_factor", "burst_start_s", "burst_duration_s"))
        if key in seen or results.param(p, "max_num_seqs") is None:
            continue
        seen.add(key)
        flags = f"--cost {calibration} --max-num-seqs {results.param(p, 'max_num_seqs')}"
        if results.param(p, "max_num_batched_tokens"):
            flags += f" --max-num-batched-tokens {results.param(p, 'max_num_batched_tokens')}"
        method, k = results.param(p, "spec_method"), results.param(p, "num_spec_tokens")
        accept = _acceptance(records, p["key"])
        if method not in (None, "none") and accept:
            flags += f" --spec-method {method} --num-spec-tokens {'auto' if k == 0 else k} --acceptance "
            flags += ",".join(f"{a:.4f}" for a in accept)
        elif method not in (None, "none"):
            continue  # no acceptance measured: nothing to simulate speculation with
        out.append({"name": f"{p['label']} seqs={results.param(p, 'max_num_seqs')}", "flags": flags, "price_per_hour": cost_per_hour})
    return out


def simulated_capacity_section(directory, points, slo, target_qps, cost_per_hour, calibration):
    """The capacity plan from `specula plan` on a calibration of this machine: each configuration's
    sustainable rate searched in the simulator rather than read off the rates the runs tried."""
    if not calibration:
        return []
    done = [p for p in points if p.get("completed")]
    if not done:
        return []
    prompt = max(1, round(sum(p.get("input_tokens") or 0 for p in done) / sum(p["completed"] for p in done)))
    output = max(1, round(sum(p.get("output_tokens") or 0 for p in done) / sum(p["completed"] for p in done)))
    cands = _candidates(directory, points, calibration, cost_per_hour)
    if not cands:
        return []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cands, f)
    args = [_binary(), "plan", "--qps", ",".join(f"{q:g}" for q in target_qps), "--candidates", f.name,
            "--input-len", str(prompt), "--output-len", str(output), "--json"]
    if slo.get("ttft_ms"):
        args += ["--slo-ttft-p99-ms", f"{slo['ttft_ms']:g}"]
    if slo.get("tpot_ms"):
        args += ["--slo-tpot-p99-ms", f"{slo['tpot_ms']:g}"]
    r = subprocess.run(args, capture_output=True, text=True)
    os.unlink(f.name)
    if r.returncode != 0:
        raise results.ReportError(f"the simulated capacity plan failed: {r.stderr.strip()}")
    plan = json.loads(r.stdout)
    rows = []
    for qi, q in enumerate(plan["qps"]):
        for ci, c in enumerate(plan["candidates"]):
            a = c["at"][qi]
            mark = " (cheapest)" if plan["cheapest"][qi] == ci else ""
            rows.append([fmt_value(q), c["name"] + mark, f"{c['capacity_rps']:.3g}",
                         a["replicas"] if a["replicas"] else "none", fmt_money(a["cost_per_mtok"] or None)])
    return ["### From the calibration (simulated)", "",
            f"`specula plan` with the step times calibrated in `{calibration}` (calibrated, this machine), each "
            f"configuration's measured acceptance, {prompt} prompt and {output} output tokens per request: "
            f"{plan['note']}.", "",
            md_table(["target QPS", "configuration", "replica QPS", "replicas", "$ per M output tokens"], rows), ""]


def render_report(run, points, mode, slo, target_qps, cost_per_hour, made_plots):
    name = run.get("name") or "unnamed experiment"
    lines = [f"# Experiment report: {name}", "", "## Assumptions", "",
             assumptions(run, points, mode, slo, cost_per_hour), ""]
    lines += plots_section(made_plots, points)
    lines += best_section(points)
    lines += results_section(points)
    lines += capacity_section(points, mode, slo, target_qps, cost_per_hour)
    lines += simulated_capacity_section(run.get("_dir", ""), points, slo, target_qps, cost_per_hour,
                                        run.get("_calibration"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- main

def write_report(directory, out=None, target_qps=DEFAULT_TARGET_QPS, cost_per_hour=DEFAULT_COST_PER_HOUR,
                 calibration=None):
    """Reads DIR, writes the report and its plots; returns the report's path. With a calibration
    (`specula experiment calibrate`; DIR/calibration.json is used when present), the capacity plan
    is also simulated from it."""
    if not os.path.isdir(directory):
        raise results.ReportError(f"{directory}: no such directory")
    run = results.load_run(directory)
    default_cal = os.path.join(directory, "calibration.json")
    run["_dir"] = directory
    run["_calibration"] = calibration or (default_cal if os.path.exists(default_cal) else None)
    points = results.aggregate(results.load_results(os.path.join(directory, "results.jsonl")))
    mode = str(run.get("mode") or results.param(points[0], "mode") or "OFFLINE").upper()
    mode = "ONLINE" if mode == "ONLINE" else "OFFLINE"  # MODE_UNSPECIFIED is OFFLINE
    slo = results.normalize_slo(run.get("slo"))
    out = out or os.path.join(directory, "report.md")
    if os.path.isdir(out):
        out = os.path.join(out, "report.md")
    out_dir = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(out_dir, exist_ok=True)
        made_plots = plots.make_plots(points, mode, slo, out_dir)
        with open(out, "w", encoding="utf-8") as f:
            f.write(render_report(run, points, mode, slo, target_qps, cost_per_hour, made_plots))
    except OSError as e:
        raise results.ReportError(f"{e.filename or out}: cannot write ({e.strerror})") from None
    return out


def parse_qps_list(text):
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"--target-qps {text!r}: expected positive numbers separated by commas")
    return values


def parse_cost(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"--cost-per-hour {text!r}: expected a positive number of dollars")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        self.exit(2, f"report: error: {message} (see --help)\n")


def parse_args(argv):
    parser = _Parser(
        prog="python3 -m experiments.report",
        description="Write the report of a `specula experiment run` output directory: report.md with "
                    "plots (PNG, beside report.md), the best configuration per batch size, every point's "
                    "results (medians over repeats) and a capacity plan. Prints the report's path.")
    parser.add_argument("dirs", metavar="DIR", nargs="+",
                        help="the directory holding run.json and results.jsonl; several: the parts of one run "
                             "(experiment run --part I/N), merged into --out's directory first")
    parser.add_argument("--out", metavar="PATH", help="where to write the report (default DIR/report.md; required "
                        "with several DIRs: a directory, or a .md path in one, which also gets the merged "
                        "run.json and results.jsonl); the plots go into the same directory")
    parser.add_argument("--target-qps", metavar="Q1,Q2,...", type=parse_qps_list, default=list(DEFAULT_TARGET_QPS),
                        help="request rates (req/s) to plan replicas for, comma-separated (default 10,100,1000)")
    parser.add_argument("--cost-per-hour", metavar="DOLLARS", type=parse_cost, default=DEFAULT_COST_PER_HOUR,
                        help="cost of one replica for an hour, for the cost per million output tokens "
                             "(default 2.5)")
    parser.add_argument("--calibration", metavar="FILE",
                        help="a step-cost file from `specula experiment calibrate` (default DIR/calibration.json "
                             "if present): the capacity plan is then also simulated from it (`specula plan`)")
    return parser.parse_args(argv)


def merged_dir(dirs, out):
    """The parts in `dirs` merged (experiments/merge.py) into --out's directory: (that directory, the
    report's path)."""
    if not out:
        raise results.ReportError(f"{len(dirs)} DIRs are the parts of one run: give --out, the directory that "
                                  "gets the merged results and the report")
    directory = out if os.path.isdir(out) or not out.endswith(".md") else (os.path.dirname(out) or ".")
    merge.merge_parts(dirs, directory)
    return directory, (out if out.endswith(".md") else os.path.join(directory, "report.md"))


def main(argv=None):
    args = parse_args(argv)
    try:
        directory, out = args.dirs[0], args.out
        if len(args.dirs) > 1:
            directory, out = merged_dir(args.dirs, args.out)
        path = write_report(directory, out, args.target_qps, args.cost_per_hour, args.calibration)
    except results.ReportError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
