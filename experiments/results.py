"""The data of an experiment's report: loading and checking run.json and results.jsonl, the points
(medians over repeats) with their labels and parameters, the rows of the report's tables and the
capacity arithmetic (replicas, cost per million tokens, the QPS a configuration sustains).
report.py renders them as markdown and plots.py draws them.

Input: DIR/run.json, one JSON object:

    {"name": "spec-vs-batch", "spec": {...the spec as JSON, proto field names...},
     "spec_path": "experiments/specs/x.textproto", "git_commit": "abc123", "build_type": "Release",
     "cpu": "Intel(R) Xeon(R) ...", "threads": 2, "simd": "avx512", "gpu": null,
     "date": "2026-11-23T10:00:00Z", "mode": "OFFLINE" | "ONLINE",
     "slo": {"ttft_ms": 500, "tpot_ms": 50},   // P99 bounds; a key may be absent; e2el_ms may be present
     "workload": {"prompts_file": "...", "num_requests": 64, "max_tokens": 128, "seed": 1}
              or {"synthetic": {"input_len": 32, "output_len": 64}, "num_requests": 64, "seed": 1}}

and DIR/results.jsonl, one JSON object per line, one per (point, repeat):

    {"key": "max_num_seqs=8,spec_method=draft,num_spec_tokens=4,temperature=0,...",  // the point's id
     "repeat": 0,
     "point": {"mode": "OFFLINE", "max_num_seqs": 8, "spec_method": "none"|"draft"|"ngram",
               "num_spec_tokens": 4,        // k; 0 = auto (adaptive); null when spec_method is "none"
               "temperature": 0.0, "max_num_batched_tokens": 2048, "kv_cache_dtype": "bf16",
               "quantization": "none",
               "request_rate": null,        // ONLINE: req/s (a number; may be the string "inf"); OFFLINE: null
               "burstiness": null,          // ONLINE: number; OFFLINE: null
               "burst_factor": null,        // ONLINE: the rate's factor inside the burst window; OFFLINE: null
               "burst_start_s": null, "burst_duration_s": null},  // ONLINE: the spec's burst window
     "num_requests": 64, "completed": 64, "rejected": 0, "failed": 0,
     "duration_s": 4.2, "request_throughput": 15.2, "output_tok_s": 1950.0, "total_tok_s": 2300.0,
     "input_tokens": 1500, "output_tokens": 8192,
     "ttft_ms": {"mean": 10.0, "p50": 9.0, "p99": 30.0}, "tpot_ms": {...}, "e2e_ms": {...},
     "goodput": 0.95,             // the share of num_requests that completed within every SLO bound,
                                  // each request on its own (absent in older results)
     "request_goodput": 14.4,     // those requests per second of duration_s
     "trace": "traces/<key>-r0.jsonl",  // with the spec's record_trace only: one line per request
     "spec": {"drafts": 100, "draft_tokens": 400, "accepted_tokens": 250, "mean_acceptance_length": 3.5,
              "acceptance_per_position": [0.9, 0.7, 0.5, 0.4],  // accepted at position i / drafts;
                                                                 // [] without speculation; spec may be null
              "accepted_per_position": [90, 70, 50, 40],  // verifications that accepted draft i
              "reached_per_position": [100, 80, 60, 45]},  // ... that verified draft i, all before it
                                                           // accepted (absent in older results)
     "k_histogram": [10, 0, 5, 20, 100] or null,  // auto only: decoding sequence-steps by k chosen (index = k)
     "drafts_cannot_pay": false or null,  // auto only: true when no acceptance would make the draft's
                                          // drafts pay, so that auto ran without them
     "peak_kv_usage": 0.31, "preemptions": 0, "steps": 400, "output_hash": "9f2c...", "elapsed_s": 4.5}

The repeats of a key are aggregated by the median of each number (element-wise for lists, per field
for objects); a point's label is "none", "draft k=4", "draft auto", "ngram k=2", "ngram auto"
("server" for a remote endpoint, whose engine parameters are null).
"""
import json
import math
import os
import statistics
import sys

# The swept parameters of a point, in the order tables show them.
PARAM_ORDER = ("temperature", "max_num_seqs", "spec_method", "num_spec_tokens", "max_num_batched_tokens",
               "kv_cache_dtype", "quantization", "request_rate", "burstiness", "burst_factor")
SPEC_DIMS = ("spec_method", "num_spec_tokens")  # shown together as the label
# The load offered to a configuration, not the configuration.
LOAD_DIMS = ("request_rate", "burstiness", "burst_factor", "burst_start_s", "burst_duration_s")
METHOD_ORDER = {"none": 0, "draft": 1, "ngram": 2}
NOT_AVAILABLE = "—"


class ReportError(Exception):
    """Bad input: printed as one line on stderr, exit status 2."""


def warn(message):
    print(f"report: warning: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------------------- input

def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load_run(directory):
    """run.json as a dict; {} (with a warning) when it is missing, so a partial DIR still reports."""
    path = os.path.join(directory, "run.json")
    if not os.path.exists(path):
        warn(f"{path} not found: the report's assumptions will be incomplete")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(run, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return run


NUMBER_FIELDS = ("num_requests", "completed", "rejected", "failed", "duration_s", "request_throughput",
                 "output_tok_s", "total_tok_s", "input_tokens", "output_tokens", "peak_kv_usage", "preemptions",
                 "goodput", "request_goodput")
LATENCY_FIELDS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _check_record(record):
    """Raises ValueError unless a results.jsonl object has the shape the report reads (null is
    allowed for any measurement: a remote endpoint has no engine counters)."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if not isinstance(record.get("key"), str):
        raise ValueError('no "key" string')
    if not isinstance(record.get("point"), dict):
        raise ValueError('no "point" object')
    for name in NUMBER_FIELDS:
        if record.get(name) is not None and not is_number(record[name]):
            raise ValueError(f'"{name}" is not a number')
    for name in LATENCY_FIELDS:
        stats = record.get(name)
        if stats is not None and not (isinstance(stats, dict) and all(
                v is None or is_number(v) for v in stats.values())):
            raise ValueError(f'"{name}" is not an object of numbers')
    if record.get("spec") is not None and not isinstance(record["spec"], dict):
        raise ValueError('"spec" is not an object')


def load_results(path):
    """The records of results.jsonl, in file order.

    A last line without a trailing newline that fails to parse is a write cut short (the run was
    killed) and is skipped with a warning; a malformed line anywhere else is an error.
    """
    if not os.path.isfile(path):
        raise ReportError(f"{path}: not found")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: cannot read ({e})") from None
    lines = text.split("\n")  # a file ending in "\n" leaves "" last; otherwise the last line is torn
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            _check_record(record)
        except ValueError as e:
            if number == len(lines):
                warn(f"{path}:{number}: skipping an incomplete last line (a run killed mid-write?)")
                continue
            raise ReportError(f"{path}:{number}: malformed line: {e}") from None
        records.append(record)
    if not records:
        raise ReportError(f"{path}: no results")
    return records


# ----------------------------------------------------------------------------------------- points

def _median(values):
    """The median of one field over repeats: numbers by value, objects per key, lists per index;
    anything else (strings, hashes) is the first repeat's."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(is_number(v) for v in present):
        return statistics.median(present)
    if all(isinstance(v, dict) for v in present):
        keys = list(dict.fromkeys(k for v in present for k in v))
        return {k: _median([v.get(k) for v in present]) for k in keys}
    if all(isinstance(v, list) for v in present):
        length = max(len(v) for v in present)
        return [_median([v[i] for v in present if i < len(v)]) for i in range(length)]
    return present[0]


# The fields whose spread over repeats the report shows: [min, max].
RANGE_FIELDS = ("output_tok_s", "total_tok_s")


def _ranges(runs):
    ranges = {}
    for f in RANGE_FIELDS:
        values = [r.get(f) for r in runs if is_number(r.get(f))]
        if values:
            ranges[f] = [min(values), max(values)]
    return ranges


def _complete(record):
    """Whether every request of a run completed (none rejected or failed)."""
    return (record.get("completed") == record.get("num_requests")
            and not record.get("rejected") and not record.get("failed"))


def param(p, name):
    return p["point"].get(name)

def fmt_value(v):
    """A parameter: 8, 0.7, "bf16", "inf"; "—" for None."""
    if v is None:
        return NOT_AVAILABLE
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def label(point):
    """A point's (a "point" object's) speculation label, as `specula experiment run` prints it."""
    method = point.get("spec_method")
    if method is None:
        return "server"  # a remote endpoint: its engine parameters are unknown
    k = point.get("num_spec_tokens")
    if method == "none" or k is None:
        return "none"
    return f"{method} auto" if k == 0 else f"{method} k={fmt_value(k)}"


def label_order(p):
    k = param(p, "num_spec_tokens")
    return (METHOD_ORDER.get(param(p, "spec_method"), 9), math.inf if k in (0, None) else k)


def sort_value(v):
    """A key that orders None, numbers (and numeric strings such as "inf") and strings together."""
    if v is None:
        return (0, 0.0, "")
    try:
        return (1, float(v), "")
    except (TypeError, ValueError):
        return (2, 0.0, str(v))


def point_order(p):
    return tuple(sort_value(param(p, d)) for d in ("temperature", "max_num_seqs")) + label_order(p) + tuple(
        sort_value(param(p, d)) for d in PARAM_ORDER[4:])


def config_key(p, without=()):
    """The point's parameters less `without`, hashable: points equal here differ only in those."""
    return tuple((name, json.dumps(value, sort_keys=True)) for name, value in sorted(p["point"].items())
                 if name not in without and name != "mode")


def speedups(points):
    """Each point's key -> its output tok/s over that of the "none" point with the same other
    parameters (None when there is no such point)."""
    base = {config_key(p, SPEC_DIMS): p.get("output_tok_s") for p in points if p["label"] == "none"}
    result = {}
    for p in points:
        b, out = base.get(config_key(p, SPEC_DIMS)), p.get("output_tok_s")
        result[p["key"]] = out / b if b and out is not None else None
    return result


def none_point(points, p):
    """The "none" point with p's other parameters, or None."""
    for q in points:
        if q["label"] == "none" and config_key(q, SPEC_DIMS) == config_key(p, SPEC_DIMS):
            return q
    return None


def speedup_range(points, p):
    """[lowest, highest] speedup over none that the repeats allow: p's slowest repeat over none's
    fastest, and p's fastest over none's slowest (None without a none point or a range)."""
    base = none_point(points, p)
    r, b = p.get("range", {}).get("output_tok_s"), base and base.get("range", {}).get("output_tok_s")
    if not r or not b or not b[0] or not b[1]:
        return None
    return [r[0] / b[1], r[1] / b[0]]


def beats_none(points, p):
    """Whether p's output tok/s beats none's beyond the spread: with at least 2 repeats each, p's
    slowest repeat is faster than none's fastest. None where there is no none point to compare."""
    base = none_point(points, p)
    if base is None or p is base:
        return None
    r, b = p.get("range", {}).get("output_tok_s"), base.get("range", {}).get("output_tok_s")
    return bool(r and b and p["repeats"] >= 2 and base["repeats"] >= 2 and r[0] > b[1])


def aggregate(records):
    """One point per key: the median of each field over its repeats, plus "label", "speedup",
    "repeats" and "incomplete_repeats" (repeats in which some request did not complete)."""
    groups = {}
    for r in records:
        groups.setdefault(r["key"], []).append(r)
    points = []
    for key, runs in groups.items():
        fields = dict.fromkeys(f for r in runs for f in r if f not in ("key", "repeat", "point"))
        p = {f: _median([r.get(f) for r in runs]) for f in fields}
        p.update(key=key, point=runs[0]["point"], label=label(runs[0]["point"]), repeats=len(runs),
                 incomplete_repeats=sum(not _complete(r) for r in runs), range=_ranges(runs))
        points.append(p)
    by_key = speedups(points)
    for p in points:
        p["speedup"] = by_key[p["key"]]
    return sorted(points, key=point_order)


def varying_dims(points):
    """The swept parameters that take more than one value, in PARAM_ORDER (unknown ones last)."""
    names = list(PARAM_ORDER) + sorted({n for p in points for n in p["point"]} - set(PARAM_ORDER) - {"mode"})
    return [n for n in names if len({json.dumps(param(p, n), sort_keys=True) for p in points}) > 1]


def stat(p, name, which):
    """A latency statistic, e.g. stat(p, "tpot_ms", "p99"); None when absent."""
    s = p.get(name)
    return s.get(which) if isinstance(s, dict) else None


def mean_acceptance_length(p):
    spec = p.get("spec")
    if p["label"] in ("none", "server") or not isinstance(spec, dict) or not spec.get("drafts"):
        return None
    return spec.get("mean_acceptance_length")


def describe(p, dims):
    """The label plus the point's values of `dims` (other than the label's own), e.g.
    "draft k=4, max_num_seqs=8"."""
    return ", ".join([p["label"]] + [f"{d}={fmt_value(param(p, d))}" for d in dims if d not in SPEC_DIMS])


def best_by(points, group):
    """group(point) -> the point of highest output tok/s in each group."""
    best = {}
    for p in points:
        g = group(p)
        if g not in best or _tok_s(p) > _tok_s(best[g]):
            best[g] = p
    return best


def _tok_s(p):
    v = p.get("output_tok_s")
    return v if is_number(v) else -math.inf


# ----------------------------------------------------------------------------------------- tables

def best_per_batch_rows(points):
    """For each (temperature, max_num_seqs), the point with the highest output tok/s."""
    other = [d for d in varying_dims(points) if d not in ("temperature", "max_num_seqs")]
    best = best_by(points, lambda p: (param(p, "temperature"), param(p, "max_num_seqs")))
    rows = []
    for (temperature, mns), p in sorted(best.items(), key=lambda kv: (sort_value(kv[0][0]), sort_value(kv[0][1]))):
        rows.append({"temperature": temperature, "max_num_seqs": mns, "label": p["label"],
                     "config": describe(p, other), "output_tok_s": p.get("output_tok_s"), "speedup": p["speedup"],
                     "output_tok_s_range": p.get("range", {}).get("output_tok_s"),
                     "speedup_range": speedup_range(points, p), "significant": beats_none(points, p),
                     "tpot_p99_ms": stat(p, "tpot_ms", "p99"), "mean_acceptance_length": mean_acceptance_length(p)})
    return rows


def full_results_rows(points):
    """One row per point: the varying parameters and the measurements."""
    dims = [d for d in varying_dims(points) if d not in SPEC_DIMS]
    rows = []
    for p in points:
        row = {"params": {d: param(p, d) for d in dims}, "label": p["label"],
               "output_tok_s": p.get("output_tok_s"), "total_tok_s": p.get("total_tok_s"),
               "output_tok_s_range": p.get("range", {}).get("output_tok_s"),
               "mean_acceptance_length": mean_acceptance_length(p), "peak_kv_usage": p.get("peak_kv_usage"),
               "preemptions": p.get("preemptions"), "completed": p.get("completed"),
               "num_requests": p.get("num_requests"), "goodput": p.get("goodput"), "repeats": p["repeats"]}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            for which in ("p50", "p99"):
                row[f"{name[:-3]}_{which}_ms"] = stat(p, name, which)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------- capacity

def replicas_needed(target_qps, qps_per_replica):
    """Replicas to serve target_qps when each sustains qps_per_replica (rounded up; 100/7.5 -> 14)."""
    # The tolerance keeps an exact multiple that float division puts a hair above from rounding up.
    return max(1, math.ceil(target_qps / qps_per_replica - 1e-9))


def cost_per_million_tokens(replicas, cost_per_hour, target_qps, output_tokens_per_request):
    """Dollars per million output tokens: the replicas' hourly cost over the tokens served in an hour."""
    return replicas * cost_per_hour / (target_qps * output_tokens_per_request * 3600) * 1e6


def mean_output_tokens(p):
    completed, tokens = p.get("completed"), p.get("output_tokens")
    return tokens / completed if completed and tokens is not None else None


def normalize_slo(slo):
    """run.json's "slo" with only the bounds that are set (absent, null or 0 is no bound)."""
    slo = slo if isinstance(slo, dict) else {}
    return {k: float(slo[k]) for k in ("ttft_ms", "tpot_ms", "e2el_ms") if is_number(slo.get(k)) and slo[k] > 0}


def meets_slo(p, slo, queue_free=True):
    """Whether the point's P99 latencies are within the SLO's bounds. With queue_free=False only TPOT
    is checked: in an OFFLINE run TTFT and E2E are dominated by the wait behind the other requests."""
    checks = [("tpot_ms", "tpot_ms")] + ([("ttft_ms", "ttft_ms"), ("e2el_ms", "e2e_ms")] if queue_free else [])
    for bound_name, stat_name in checks:
        bound = slo.get(bound_name)
        if not bound:
            continue
        value = stat(p, stat_name, "p99")
        if value is None or value > bound:
            return False
    return True


def completed_all(p):
    """Every request of every repeat completed (none rejected or failed)."""
    return p.get("incomplete_repeats", 0) == 0 and _complete(p)


def rate_value(v):
    """request_rate as a float: "inf" -> inf; None (or junk) -> None."""
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _options(candidates, dims):
    """[(qps or None, point or None, description)] -> option dicts, best first (no QPS last)."""
    options = [{"qps": qps, "point": p, "config": describe(p, dims)} for qps, p in candidates]
    options.sort(key=lambda o: (o["qps"] is None, -(o["qps"] or 0), -_tok_s(o["point"]), o["config"]))
    return options


def sustainable_qps(points, slo):
    """ONLINE: for each configuration (a point less its LOAD_DIMS), the highest offered request_rate it
    sustains: at that rate every request of every repeat completed and the P99 TTFT/TPOT/E2E are
    within the SLO, at every burstiness and burst factor tried. "inf" rates are ignored.

    Returns [{"qps", "point" (the run at that rate), "config"}], best first; qps None when the
    configuration sustains no rate (its point is then its lowest-rate one)."""
    by_config = {}
    for p in points:
        rate = rate_value(param(p, "request_rate"))
        if rate is None or not math.isfinite(rate) or rate <= 0:
            continue
        by_config.setdefault(config_key(p, LOAD_DIMS), {}).setdefault(rate, []).append(p)
    dims = [d for d in varying_dims(points) if d not in LOAD_DIMS]
    candidates = []
    for rates in by_config.values():
        ok = [r for r, runs in rates.items() if all(completed_all(p) and meets_slo(p, slo) for p in runs)]
        rate = max(ok) if ok else min(rates)
        candidates.append((rate if ok else None, rates[rate][0]))
    return _options(candidates, dims)


def offline_qps(points, slo):
    """OFFLINE: each point's request_throughput when it completed every request and its P99 TPOT is
    within the SLO (TTFT is the queue here and is not applied), else None; best first. An upper
    bound: requests arriving over time would also have to meet the TTFT bound."""
    dims = varying_dims(points)
    candidates = [(p.get("request_throughput") if completed_all(p) and meets_slo(p, slo, queue_free=False)
                   and p.get("request_throughput") else None, p) for p in points]
    return _options(candidates, dims)


def capacity_plan(options, target_qps, cost_per_hour):
    """For each target QPS, the replicas of the best option (options[0] when it has a QPS) and the
    cost per million output tokens. Rows hold None where no configuration meets the SLO."""
    best = options[0] if options and (options[0]["qps"] or 0) > 0 else None
    rows = []
    for target in target_qps:
        row = {"target_qps": target, "replica_qps": None, "config": None, "replicas": None, "cost_per_million": None}
        if best is not None:
            replicas = replicas_needed(target, best["qps"])
            tokens = mean_output_tokens(best["point"])
            row.update(replica_qps=best["qps"], config=best["config"], replicas=replicas,
                       cost_per_million=cost_per_million_tokens(replicas, cost_per_hour, target, tokens)
                       if tokens else None)
        rows.append(row)
    return rows
