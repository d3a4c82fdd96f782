"""The plots of an experiment's report (matplotlib, PNG files): output tok/s and speedup against
max_num_seqs, acceptance by draft position and, ONLINE, P99 latency against the request rate."""
import math
import os

try:
    from experiments import results
except ImportError:  # run as a script: its own directory is on sys.path
    import results


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise results.ReportError("the plots need matplotlib: python3 -m pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _subplots(plt, n, width=5.5, height=4.0):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def _batch_axis(ax, xs):
    """max_num_seqs usually doubles: a log2 axis with the swept values as its ticks."""
    xs = sorted(set(xs))
    if len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 4:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
    ax.set_xticks(xs, [results.fmt_value(x) for x in xs])
    ax.set_xlabel("max_num_seqs")


def _save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _batch_series(points, value):
    """{temperature: {label: [(max_num_seqs, value(point))]}}, from the point of highest output tok/s
    per (temperature, label, max_num_seqs): the other swept dimensions are folded by the best."""
    best = results.best_by([p for p in points if results.is_number(results.param(p, "max_num_seqs"))],
                           lambda p: (results.param(p, "temperature"), p["label"], results.param(p, "max_num_seqs")))
    order = {p["label"]: results.label_order(p) for p in points}
    series = {}
    for (t, lab, mns), p in sorted(best.items(), key=lambda kv: (order[kv[0][1]], kv[0][2])):
        v = value(p)
        if v is not None:
            series.setdefault(t, {}).setdefault(lab, []).append((mns, v))
    return {t: series[t] for t in sorted(series, key=results.sort_value)}


def _plot_vs_batch(plt, points, value, ylabel, path, baseline=False):
    """One subplot per temperature of value(point) against max_num_seqs, a line per label; with
    `baseline`, the dashed line at 1.0 that "none" sits on."""
    series = _batch_series(points, value)
    if not series:
        return False
    fig, axes = _subplots(plt, len(series))
    for ax, (t, lines) in zip(axes, series.items()):
        if baseline:
            ax.axhline(1.0, color="gray", linestyle="--", label="none (1.0)")
        for lab, xy in lines.items():
            ax.plot(*zip(*xy), marker="o", label=lab)
        _batch_axis(ax, [x for xy in lines.values() for x, _ in xy])
        ax.set_ylabel(ylabel)
        ax.set_title(f"temperature {results.fmt_value(t)}")
        ax.grid(alpha=0.3)
        ax.legend()
    _save(plt, fig, path)
    return True


def plot_throughput(plt, points, path):
    return _plot_vs_batch(plt, points, lambda p: p.get("output_tok_s"), "output tok/s", path)


def plot_speedup(plt, points, path):
    return _plot_vs_batch(plt, [p for p in points if p["label"] != "none"], lambda p: p["speedup"],
                          "speedup over none (output tok/s)", path, baseline=True)


def acceptance_by_position(points):
    """{temperature: {label: [rate at position 1, 2, ...]}}, pooled over the label's points (batch
    sizes and other dimensions) weighted by their drafts: accepted at position i / all drafts."""
    sums = {}
    for p in points:
        spec = p.get("spec") if isinstance(p.get("spec"), dict) else {}
        rates, drafts = spec.get("acceptance_per_position") or [], spec.get("drafts")
        if p["label"] in ("none", "server") or not rates or drafts == 0:
            continue
        weight = drafts if results.is_number(drafts) else 1
        acc = sums.setdefault((results.param(p, "temperature"), p["label"]), ([], [], results.label_order(p)))
        for i, r in enumerate(rates):
            if i == len(acc[0]):
                acc[0].append(0.0)
                acc[1].append(0.0)
            if results.is_number(r):
                acc[0][i] += r * weight
                acc[1][i] += weight
    result = {}
    for (t, lab), (num, den, _) in sorted(sums.items(), key=lambda kv: (results.sort_value(kv[0][0]), kv[1][2])):
        result.setdefault(t, {})[lab] = [n / d if d else 0.0 for n, d in zip(num, den)]
    return result


def plot_acceptance(plt, points, path):
    series = acceptance_by_position(points)
    if not series:
        return False
    fig, axes = _subplots(plt, len(series))
    for ax, (t, lines) in zip(axes, series.items()):
        for lab, rates in lines.items():
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=lab)
        longest = max(len(r) for r in lines.values())
        ax.set_xticks(range(1, longest + 1))
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted / drafts")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"temperature {results.fmt_value(t)}")
        ax.grid(alpha=0.3)
        ax.legend()
    _save(plt, fig, path)
    return True


def plot_latency(plt, points, slo, path):
    """ONLINE: P99 TTFT and TPOT against the offered rate, a line per configuration."""
    dims = [d for d in results.varying_dims(points) if d != "request_rate"]
    series = {}
    for p in points:
        rate = results.rate_value(results.param(p, "request_rate"))
        if rate is not None and math.isfinite(rate):
            series.setdefault(results.describe(p, dims), []).append((rate, p))
    if not series:
        return False
    fig, axes = _subplots(plt, 2, width=6.5)
    for ax, (name, title, bound) in zip(axes, (("ttft_ms", "P99 TTFT (ms)", slo.get("ttft_ms")),
                                               ("tpot_ms", "P99 TPOT (ms)", slo.get("tpot_ms")))):
        for config, runs in series.items():
            xy = sorted((r, results.stat(p, name, "p99")) for r, p in runs
                        if results.stat(p, name, "p99") is not None)
            if xy:
                ax.plot(*zip(*xy), marker="o", label=config)
        if bound:
            ax.axhline(bound, color="red", linestyle="--", label=f"SLO {results.fmt_value(bound)} ms")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _save(plt, fig, path)
    return True


PLOTS = (  # file, title, what a plot without data lacks
    ("throughput_vs_batch.png", "Output tok/s against max_num_seqs", "no point has max_num_seqs and output tok/s"),
    ("speedup_vs_batch.png", "Speedup over no speculation against max_num_seqs",
     'no speculative point has a "none" point with the same other parameters'),
    ("acceptance_by_position.png", "Acceptance rate by draft position", "no point has per-position acceptance"),
    ("latency_vs_rate.png", "P99 TTFT and TPOT against request rate", "no point has a finite request_rate"),
)


def make_plots(points, mode, slo, out_dir):
    """Writes the plots; returns [(file, title, written)] for the report to link or explain."""
    plt = _pyplot()
    draw = {"throughput_vs_batch.png": lambda path: plot_throughput(plt, points, path),
            "speedup_vs_batch.png": lambda path: plot_speedup(plt, points, path),
            "acceptance_by_position.png": lambda path: plot_acceptance(plt, points, path),
            "latency_vs_rate.png": lambda path: plot_latency(plt, points, slo, path)}
    made = []
    for name, title, _ in PLOTS:
        if name == "latency_vs_rate.png" and mode != "ONLINE":
            continue
        made.append((name, title, draw[name](os.path.join(out_dir, name))))
    return made
