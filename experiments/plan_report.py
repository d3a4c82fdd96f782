#!/usr/bin/env python3
"""plan.md and its plots from `specula plan --out DIR` (DIR/plan.json).

Plots: P99 TTFT against the load of one replica, per candidate; replicas against the target load;
cost per million output tokens against the P99 TTFT bound. Every candidate is labelled with where
its step times come from (measured, calibrated or roofline).
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def origin(c):
    """'measured', 'calibrated' or 'roofline': the first word after 'step times: '."""
    src = c["source"].replace("step times: ", "")
    return src.split(",")[0]


def label(c):
    return f"{c['name']} ({origin(c)})"


def capacity_at(c, ttft_bound):
    """The highest simulated rate whose P99 TTFT is within `ttft_bound` and which met the other bounds."""
    best = 0.0
    for p in c["curve"]:
        other_ok = p["meets"] or p["ttft_ms"]["p99"] > ttft_bound
        if p["ttft_ms"]["p99"] <= ttft_bound and other_ok:
            best = max(best, p["rate"])
    return best


def finish(fig, ax, path, xlabel, ylabel, title):
    """Log-log axes, labels, legend; writes the PNG."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load(plan, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in plan["candidates"]:
        rates = [p["rate"] for p in c["curve"]]
        ax.plot(rates, [p["ttft_ms"]["p99"] for p in c["curve"]], marker="o", label=label(c))
    if plan["slo"]["ttft_p99_ms"] > 0:
        ax.axhline(plan["slo"]["ttft_p99_ms"], color="grey", linestyle="--", label="P99 TTFT bound")
    finish(fig, ax, os.path.join(out, "plan_p99_vs_load.png"), "requests/s per replica", "P99 TTFT (ms)",
           "P99 TTFT against load, one replica")


def plot_replicas(plan, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lo, hi = min(plan["qps"]) / 10, max(plan["qps"]) * 10
    qs = [lo * (hi / lo) ** (i / 40) for i in range(41)]
    for c in plan["candidates"]:
        if c["capacity_rps"] <= 0:
            continue
        ax.plot(qs, [math.ceil(q / c["capacity_rps"]) for q in qs], label=label(c))
    for q in plan["qps"]:
        ax.axvline(q, color="grey", linestyle=":")
    finish(fig, ax, os.path.join(out, "plan_replicas_vs_qps.png"), "target load (requests/s)", "replicas",
           "Replicas against load")


def plot_cost(plan, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    tokens = plan["workload"]["output_len"]
    bounds = [50 * 1.25 ** i for i in range(25)]
    for c in plan["candidates"]:
        xs, ys = [], []
        for b in bounds:
            cap = capacity_at(c, b)
            if cap > 0:
                xs.append(b)
                ys.append(c["price_per_hour"] / 3600 / (cap * tokens) * 1e6)
        ax.plot(xs, ys, marker=".", label=label(c))
    finish(fig, ax, os.path.join(out, "plan_cost_vs_slo.png"), "P99 TTFT bound (ms)", "cost per million output tokens",
           "Cost against the TTFT SLO (full replicas)")


def markdown(plan):
    slo = plan["slo"]
    lines = ["# Capacity plan", "", f"SLOs: P99 TTFT <= {slo['ttft_p99_ms']} ms"
             + (f", P99 TPOT <= {slo['tpot_p99_ms']} ms" if slo["tpot_p99_ms"] > 0 else "")
             + f", goodput >= {slo['goodput']}. Workload: {plan['workload']['input_len']} prompt and "
             f"{plan['workload']['output_len']} output tokens, burstiness {plan['workload']['burstiness']}, "
             f"burst factor {plan['workload']['burst_factor']}.", "",
             f"How: {plan['note']}; planned in {plan.get('planning_seconds', 0):.1f} s.", "",
             "| candidate | step times | req/s per replica |", "|---|---|---|"]
    for c in plan["candidates"]:
        lines.append(f"| {c['name']} | {c['source'].replace('step times: ', '')} | {c['capacity_rps']:.3g} |")
    for qi, q in enumerate(plan["qps"]):
        lines += ["", f"## At {q:g} requests/s", "",
                  "| candidate | replicas | cost / M output tokens | headroom | largest burst absorbed | P99 TTFT (ms) |",
                  "|---|---|---|---|---|---|"]
        for ci, c in enumerate(plan["candidates"]):
            a = c["at"][qi]
            mark = " **(cheapest)**" if plan["cheapest"][qi] == ci else ""
            if a["replicas"] == 0:
                lines.append(f"| {c['name']} | none meets the SLOs | | | | |")
                continue
            lines.append(f"| {c['name']} ({origin(c)}){mark} | {a['replicas']:,} | {a['cost_per_mtok']:.4f} | "
                         f"{100 * a['headroom']:.0f}% | {a['burst_sustained']:.1f}x | {a['ttft_p99_ms']:.1f} |")
    lines += ["", "![P99 against load](plan_p99_vs_load.png)", "", "![replicas against load](plan_replicas_vs_qps.png)",
              "", "![cost against SLO](plan_cost_vs_slo.png)", ""]
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: plan_report.py DIR/plan.json")
    path = sys.argv[1]
    with open(path) as f:
        plan = json.load(f)
    out = os.path.dirname(os.path.abspath(path))
    plot_load(plan, out)
    plot_replicas(plan, out)
    plot_cost(plan, out)
    with open(os.path.join(out, "plan.md"), "w") as f:
        f.write(markdown(plan))


if __name__ == "__main__":
    main()
