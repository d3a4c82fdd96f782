#!/usr/bin/env python3
"""The fidelity table of docs/simulator.md from `specula simulate --validate ... --json` outputs.

Each cell is the prediction's error against the mean of the repeats, and a cell passes when it is
within the bound (P50 5%, P99 10%, throughput 3%, goodput and refusals 10%), or within the spread
of the repeats where that is wider (the prediction lies inside [min, max] of what ran). Also the knee:
per configuration, the first rate whose P99 TTFT passes the SLO, measured and predicted; and, by kind
of step, the model's total over the runs' own recorded steps against their measured total.

    python3 bench/sim_fidelity_table.py SLO_MS FILE.json [FILE.json ...]
"""
import json
import sys

BOUNDS = {"ttft_p50_ms": 0.05, "tpot_p50_ms": 0.05, "ttft_p99_ms": 0.10, "tpot_p99_ms": 0.10,
          "output_tok_s": 0.03, "goodput": 0.10, "refused": 0.10}
COLUMNS = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "output_tok_s", "goodput", "refused"]


def cell(point, key):
    m, p = point["measured"].get(key), point["predicted"].get(key)
    if m is None or p is None:
        return "-", True
    lo, hi = point["measured"]["min"][key], point["measured"]["max"][key]
    if key == "refused" and m == 0 and p == 0:
        return "0 / 0", True
    err = (p - m) / m if m else (0.0 if p == 0 else float("inf"))
    ok = abs(err) <= BOUNDS[key] or lo <= p <= hi
    text = f"{100 * err:+.1f}%" + ("" if ok else " ✗")
    return text, ok


def describe(params):
    spec = params.get("spec_method") or "none"
    k = params.get("num_spec_tokens")
    label = spec if spec == "none" else f"{spec} {'auto' if k == 0 else 'k=' + str(k)}"
    burst = params.get("burst_factor") or 1
    return f"{label}, {params.get('request_rate')} req/s" + (f", {burst:g}x burst" if burst != 1 else "")


def knee(points, slo, which):
    """Per (speculation, burst): the highest rate whose P99 TTFT is within the SLO."""
    out = {}
    for p in points:
        par = p["params"]
        key = (par.get("spec_method"), par.get("burst_factor") or 1)
        if p[which]["ttft_p99_ms"] is not None and p[which]["ttft_p99_ms"] <= slo:
            out[key] = max(out.get(key, 0), par["request_rate"])
        else:
            out.setdefault(key, 0)
    return out


def step_errors(points):
    """The model over the runs' own steps ("step_times"), summed over every point, by kind of step."""
    total = {}
    for p in points:
        for kind, k in (p.get("step_times") or {}).items():
            t = total.setdefault(kind, [0.0, 0.0])
            t[0] += k["measured_s"]
            t[1] += k["predicted_s"]
    return ", ".join(f"{kind} {100 * (p - m) / m:+.0f}%" for kind, (m, p) in total.items() if m > 0)


def main():
    slo = float(sys.argv[1])
    points = []
    for path in sys.argv[2:]:
        with open(path) as f:
            points += json.load(f)["points"]
    print("| point | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    passed = total = 0
    for p in points:
        cells = [cell(p, k) for k in COLUMNS]
        passed += sum(ok for _, ok in cells)
        total += len(cells)
        print(f"| {describe(p['params'])} | " + " | ".join(c for c, _ in cells) + " |")
    print(f"\n{passed} of {total} cells within their bound or the repeats' spread.")
    measured, predicted = knee(points, slo, "measured"), knee(points, slo, "predicted")
    rates = sorted({p["params"]["request_rate"] for p in points})
    for key in sorted(measured, key=str):
        m, s = measured[key], predicted.get(key, 0)
        step = abs(rates.index(m) - rates.index(s)) if m in rates and s in rates else "?"
        print(f"knee ({key[0]}, {key[1]:g}x burst): measured {m} req/s, predicted {s} req/s ({step} step(s) apart)")
    errors = step_errors(points)
    if errors:
        print(f"the model over the runs' own steps: {errors}")


if __name__ == "__main__":
    main()
