#!/usr/bin/env python3
"""Tests of the experiment report (experiments/report.py, results.py, plots.py) on the hand-written
fixtures in tests/experiments/fixtures.

    python3 tests/experiments/python/test_report.py -v

The offline fixture: max_num_seqs 1, 8, 32 x none / draft k=2 / draft auto at temperature 0, two
repeats each, SLO P99 TPOT <= 40 ms (P99 TTFT <= 500 ms, which OFFLINE does not apply). The online
fixture: none and draft k=2 at max_num_seqs 8 x request_rate 2, 4, 8, one repeat, SLO P99 TTFT
<= 500 ms and P99 TPOT <= 50 ms; "none" breaks the TTFT bound at rate 8, where 30 of its 32
requests are within every bound (goodput 0.9375; every other run's is 1). The expected numbers
below are worked out by hand from those files (the median of two repeats is their mean).
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.environ.get("SPECULA_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, ROOT)

from experiments import plots, report, results  # noqa: E402  (needs ROOT on the path)

FIXTURES = os.path.join(ROOT, "tests", "experiments", "fixtures")


def run_tool(directory, *args, cwd=ROOT, script=False):
    """The report tool as users run it: `python3 -m experiments.report` from the repository root,
    or `python3 path/to/experiments/report.py` from anywhere."""
    command = [sys.executable] + ([os.path.join(ROOT, "experiments", "report.py")] if script
                                  else ["-m", "experiments.report"])
    return subprocess.run(command + [directory, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def png_size(path):
    """(width, height) of a PNG file; fails the caller's assertion on anything else."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def linked_images(markdown):
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def read_records(name):
    with open(os.path.join(FIXTURES, name, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def by_label_and_batch(points):
    return {(p["label"], results.param(p, "max_num_seqs")): p for p in points}


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="specula_report_test_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def copy_fixture(self, name):
        target = os.path.join(self.tmp, name)
        shutil.copytree(os.path.join(FIXTURES, name), target)
        return target

    def assert_report_with_plots(self, result, report_path, expected_plots):
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), report_path)
        with open(report_path, encoding="utf-8") as f:
            markdown = f.read()
        self.assertEqual(sorted(linked_images(markdown)), sorted(expected_plots))
        for name in expected_plots:
            width, height = png_size(os.path.join(os.path.dirname(report_path), name))
            self.assertGreater(width, 100, name)
            self.assertGreater(height, 100, name)
        return markdown


class OfflineReportTest(TempDirTest):
    PLOTS = ["throughput_vs_batch.png", "speedup_vs_batch.png", "acceptance_by_position.png"]

    def setUp(self):
        super().setUp()
        self.dir = self.copy_fixture("offline")
        self.points = results.aggregate(results.load_results(os.path.join(self.dir, "results.jsonl")))

    def generate(self):
        result = run_tool(self.dir, "--target-qps", "10,100", "--cost-per-hour", "2.5")
        return self.assert_report_with_plots(result, os.path.join(self.dir, "report.md"), self.PLOTS)

    def test_medians_over_repeats(self):
        self.assertEqual(len(self.points), 9)
        p = by_label_and_batch(self.points)
        self.assertEqual({q["repeats"] for q in self.points}, {2})
        self.assertEqual(p["none", 1]["output_tok_s"], 100)            # 95, 105
        self.assertEqual(p["draft k=2", 32]["output_tok_s"], 1320)     # 1300, 1340
        self.assertEqual(results.stat(p["none", 32], "tpot_ms", "p99"), 42)  # 40, 44
        self.assertAlmostEqual(p["none", 32]["peak_kv_usage"], 0.91)  # 0.9, 0.92
        self.assertEqual(p["none", 32]["preemptions"], 3)              # 2, 4
        self.assertAlmostEqual(p["draft auto", 8]["request_throughput"], 7.5)  # 7.4, 7.6
        self.assertEqual(p["draft auto", 1]["k_histogram"], [0, 0, 11, 29, 60])
        for got, want in zip(p["draft k=2", 8]["spec"]["acceptance_per_position"], [0.85, 0.55]):
            self.assertAlmostEqual(got, want)

    def test_speedups(self):
        p = by_label_and_batch(self.points)
        self.assertAlmostEqual(p["draft auto", 1]["speedup"], 2.1)     # 210 / 100
        self.assertAlmostEqual(p["draft k=2", 8]["speedup"], 1.4375)   # 920 / 640
        self.assertAlmostEqual(p["draft k=2", 32]["speedup"], 0.8)     # 1320 / 1650: past the crossover
        self.assertEqual(p["none", 8]["speedup"], 1.0)

    def test_best_per_batch_rows(self):
        rows = results.best_per_batch_rows(self.points)
        got = [(r["max_num_seqs"], r["label"], r["output_tok_s"], round(r["speedup"], 4), r["tpot_p99_ms"],
                r["mean_acceptance_length"]) for r in rows]
        self.assertEqual(got, [(1, "draft auto", 210, 2.1, 6, 3.0),
                               (8, "draft auto", 960, 1.5, 10, 3.0),
                               (32, "none", 1650, 1.0, 42, None)])

    def test_best_is_named_only_beyond_the_spread(self):
        rows = {r["max_num_seqs"]: r for r in results.best_per_batch_rows(self.points)}
        self.assertTrue(rows[1]["significant"])   # 200-220 against 95-105
        self.assertIsNone(rows[32]["significant"])  # none itself is best
        # none at 8 seqs with one repeat as fast as draft auto's slowest: the ranges touch.
        records = read_records("offline")
        for r in records:
            if r["point"]["max_num_seqs"] == 8 and r["point"]["spec_method"] == "none" and r["repeat"] == 1:
                r["output_tok_s"] = 950
        points = results.aggregate(records)
        row8 = [r for r in results.best_per_batch_rows(points) if r["max_num_seqs"] == 8][0]
        self.assertEqual((row8["label"], row8["significant"]), ("draft auto", False))
        markdown = "\n".join(report.best_section(points))
        self.assertIn("| 8 | 0 | no significant difference (by median: draft auto) |", markdown)
        self.assertIn("| 1 | 0 | draft auto |", markdown)
        # One repeat is no spread: never significant.
        single = results.aggregate([r for r in read_records("offline") if r["repeat"] == 0])
        self.assertFalse(any(r["significant"] for r in results.best_per_batch_rows(single)))

    def test_full_results_rows(self):
        rows = results.full_results_rows(self.points)
        self.assertEqual(len(rows), 9)
        self.assertEqual([r["params"] for r in rows[:3]], [{"max_num_seqs": 1}] * 3)  # only the batch varies
        self.assertEqual([r["label"] for r in rows[:3]], ["none", "draft k=2", "draft auto"])
        row = rows[6]  # none at max_num_seqs 32
        self.assertEqual((row["label"], row["params"]), ("none", {"max_num_seqs": 32}))
        self.assertEqual((row["ttft_p50_ms"], row["ttft_p99_ms"], row["tpot_p50_ms"], row["tpot_p99_ms"]),
                         (925, 1550, 31, 42))
        self.assertIsNone(row["mean_acceptance_length"])
        self.assertAlmostEqual(rows[7]["mean_acceptance_length"], 2.3)  # draft k=2: 2.2, 2.4

    def test_offline_capacity_is_the_tpot_bound_throughput(self):
        slo = results.normalize_slo({"ttft_ms": 500, "tpot_ms": 40})
        options = results.offline_qps(self.points, slo)
        # draft auto at 8 seqs: 7.5 req/s with P99 TPOT 10 ms; its P99 TTFT of 800 ms is the queue and
        # is not applied. Every max_num_seqs 32 point is faster but over 40 ms TPOT.
        self.assertEqual((options[0]["config"], options[0]["qps"]), ("draft auto, max_num_seqs=8", 7.5))
        self.assertGreater(results.stat(options[0]["point"], "ttft_ms", "p99"), 500)
        over = {o["config"] for o in options if o["qps"] is None}
        self.assertEqual(over, {"none, max_num_seqs=32", "draft k=2, max_num_seqs=32", "draft auto, max_num_seqs=32"})
        plan = results.capacity_plan(options, [10, 100], 2.5)
        self.assertEqual([r["replicas"] for r in plan], [2, 14])  # ceil(10 / 7.5), ceil(100 / 7.5)
        # 128 output tokens per request: 2 * 2.5 / (10 * 128 * 3600) * 1e6, 14 * 2.5 / (100 * 128 * 3600) * 1e6
        self.assertAlmostEqual(plan[0]["cost_per_million"], 1.0850694, places=6)
        self.assertAlmostEqual(plan[1]["cost_per_million"], 0.7595486, places=6)

    def test_acceptance_pooled_by_label(self):
        series = plots.acceptance_by_position(self.points)
        self.assertEqual(list(series), [0.0])
        self.assertEqual(list(series[0.0]), ["draft k=2", "draft auto"])
        for got, want in zip(series[0.0]["draft auto"], [0.91, 0.71, 0.51, 0.31]):
            self.assertAlmostEqual(got, want)

    def test_report_from_fixture(self):
        markdown = self.generate()
        self.assertIn("# Experiment report: spec-vs-batch", markdown)
        sections = ["## Assumptions", "## Plots", "## Best configuration per batch size", "## All results",
                    "## Capacity plan"]
        self.assertEqual(sorted(sections, key=markdown.index), sections)
        for fact in ("Intel(R) Xeon(R) Platinum 8375C", "2 threads", "avx512", "Release", "abc1234",
                     "2026-11-23T10:00:00Z", "OFFLINE", "data/prompts.jsonl", "64 requests", "max_tokens 128",
                     "P99 TPOT ≤ 40 ms", "median over 2 repeats", "$2.50 per replica-hour"):
            self.assertIn(fact, markdown)
        # The best-per-batch rows, then rows of the full table, then the capacity plan.
        # Medians with their spread over the 2 repeats: 200-220 against none's 95-105 gives 1.90-2.32x.
        self.assertIn("| 1 | 0 | draft auto | 210.0 (200.0–220.0) | 2.10x (1.90–2.32x) | 6.0 | 3.00 |", markdown)
        self.assertIn("| 8 | 0 | draft auto | 960.0 (950.0–970.0) | 1.50x (1.44–1.56x) | 10.0 | 3.00 |", markdown)
        self.assertIn("| 32 | 0 | none | 1650.0 (1600.0–1700.0) | 1.00x (0.94–1.06x) | 42.0 | — |", markdown)
        self.assertIn("| 32 | draft k=2 | 1320.0 (1300.0–1340.0) |", markdown)
        self.assertIn("| 925.0 | 1550.0 | 31.0 | 42.0 |", markdown)
        self.assertIn("upper bound", markdown)
        self.assertIn("| 10 | 7.5 | draft auto, max_num_seqs=8 | 2 | $1.09 |", markdown)
        self.assertIn("| 100 | 7.5 | draft auto, max_num_seqs=8 | 14 | $0.76 |", markdown)
        self.assertNotIn("| 1000 |", markdown)  # only the targets asked for

    def test_script_path_and_out(self):
        out = os.path.join(self.tmp, "elsewhere", "sub", "r.md")
        result = run_tool(self.dir, "--out", out, cwd=self.tmp, script=True)
        self.assert_report_with_plots(result, out, self.PLOTS)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "report.md")))
        with open(out, encoding="utf-8") as f:  # the default targets
            self.assertIn("| 1000 | 7.5 | draft auto, max_num_seqs=8 | 134 |", f.read())


class OnlineReportTest(TempDirTest):
    SLO = {"ttft_ms": 500.0, "tpot_ms": 50.0}

    def setUp(self):
        super().setUp()
        self.records = read_records("online")

    def qps(self, records=None, slo=None):
        points = results.aggregate(records or self.records)
        return {o["config"]: o["qps"] for o in results.sustainable_qps(points, self.SLO if slo is None else slo)}

    def test_sustainable_qps(self):
        # none breaks P99 TTFT (900 > 500 ms) at 8 req/s and so gets the next lower rate.
        self.assertEqual(self.qps(), {"draft k=2": 8.0, "none": 4.0})

    def test_rejected_requests_do_not_count(self):
        for r in self.records:
            if r["point"]["spec_method"] == "draft" and r["point"]["request_rate"] == 8:
                r.update(completed=30, rejected=2)
        self.assertEqual(self.qps(), {"draft k=2": 4.0, "none": 4.0})

    def test_one_incomplete_repeat_does_not_count(self):
        # Three repeats of draft at 8 req/s, one with a failed request: the median completed is
        # still 32, but the rate is not sustained.
        extra = [dict(r, repeat=i) for r in self.records for i in (1, 2)
                 if r["point"]["spec_method"] == "draft" and r["point"]["request_rate"] == 8]
        extra[0].update(completed=31, failed=1)
        self.assertEqual(self.qps(self.records + extra)["draft k=2"], 4.0)

    def test_inf_rate_is_ignored(self):
        inf = [dict(r, key=r["key"] + ",inf", point=dict(r["point"], request_rate="inf"))
               for r in self.records if r["point"]["request_rate"] == 2]
        self.assertEqual(self.qps(self.records + inf), {"draft k=2": 8.0, "none": 4.0})

    def test_slo_bounds(self):
        self.assertEqual(self.qps(slo={"tpot_ms": 50.0}), {"draft k=2": 8.0, "none": 8.0})  # no TTFT bound
        self.assertEqual(self.qps(slo={}), {"draft k=2": 8.0, "none": 8.0})
        # P99 E2E: draft 848, 1110, 2000 ms; none 1380, 2220, 3780 ms.
        self.assertEqual(self.qps(slo={"e2el_ms": 1500.0}), {"draft k=2": 4.0, "none": 2.0})
        self.assertEqual(results.normalize_slo({"ttft_ms": 0, "tpot_ms": 50}), {"tpot_ms": 50.0})

    def test_no_configuration_meets_the_slo(self):
        options = results.sustainable_qps(results.aggregate(self.records), {"ttft_ms": 10.0})
        self.assertEqual([o["qps"] for o in options], [None, None])
        plan = results.capacity_plan(options, [10, 100], 2.5)
        self.assertEqual([(r["replicas"], r["replica_qps"], r["cost_per_million"]) for r in plan], [(None,) * 3] * 2)

        directory = self.copy_fixture("online")
        with open(os.path.join(directory, "run.json")) as f:
            run = json.load(f)
        run["slo"] = {"ttft_ms": 10}
        with open(os.path.join(directory, "run.json"), "w") as f:
            json.dump(run, f)
        result = run_tool(directory, "--target-qps", "10")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(directory, "report.md"), encoding="utf-8") as f:
            markdown = f.read()
        self.assertIn("No configuration meets the SLO", markdown)
        self.assertIn("| 10 | n/a | n/a | n/a | n/a |", markdown)

    def test_report_from_fixture(self):
        directory = self.copy_fixture("online")
        result = run_tool(directory, "--target-qps", "10,100", "--cost-per-hour", "2.5")
        markdown = self.assert_report_with_plots(
            result, os.path.join(directory, "report.md"),
            ["throughput_vs_batch.png", "speedup_vs_batch.png", "acceptance_by_position.png", "latency_vs_rate.png"])
        for fact in ("ONLINE", "synthetic prompts of 32 tokens generating 64 tokens", "32 requests",
                     "P99 TTFT ≤ 500 ms, P99 TPOT ≤ 50 ms", "median over 1 repeat"):
            self.assertIn(fact, markdown)
        self.assertNotIn("upper bound", markdown)
        # Best at 8 seqs: draft k=2 at 8 req/s, 512 tok/s against none's 470 at the same rate.
        # One repeat: no spread, so nothing is named best.
        self.assertIn("| 8 | 0 | no significant difference (by median: draft k=2, request_rate=8) | 512.0 | 1.09x | 25.0 "
                      "| 2.20 |", markdown)
        # 64 output tokens per request: 2 * 2.5 / (10 * 64 * 3600) * 1e6 = 2.17;
        # 13 * 2.5 / (100 * 64 * 3600) * 1e6 = 1.41.
        self.assertIn("| 10 | 8 | draft k=2 | 2 | $2.17 |", markdown)
        self.assertIn("| 100 | 8 | draft k=2 | 13 | $1.41 |", markdown)
        self.assertIn("| none | 4 | 256.0 | 300.0 | 30.0 |", markdown)
        # Goodput, the last column of "All results": none at 8 req/s, 30 of 32 requests within the SLO.
        self.assertIn("| preemptions | goodput |", markdown)
        self.assertIn("| 8 | 470.0 | 705.1 | 360.0 | 900.0 | 31.5 | 45.0 | 2376.0 | 3780.0 | — | 80% | 0 | 94% |",
                      markdown)

    def test_burst_factor_is_a_load_dimension(self):
        # The same runs again under a five-fold burst: draft k=2 at 8 req/s then breaks P99 TTFT.
        bursts = []
        for r in self.records:
            b = json.loads(json.dumps(r))
            b["key"] += ",burst_factor=5"
            b["point"].update(burst_factor=5.0, burst_start_s=1.0, burst_duration_s=2.0)
            if r["point"]["request_rate"] == 8:
                b["ttft_ms"]["p99"], b["goodput"] = 900, 0.5
            bursts.append(b)
        for r in self.records:
            r["point"].update(burst_factor=1.0, burst_start_s=1.0, burst_duration_s=2.0)
        records = self.records + bursts
        self.assertEqual(self.qps(records), {"draft k=2": 4.0, "none": 4.0})  # every burst factor tried
        rows = results.full_results_rows(results.aggregate(records))
        self.assertEqual(set(rows[0]["params"]), {"request_rate", "burst_factor"})  # the window does not vary
        self.assertEqual(sorted(r["goodput"] for r in rows if r["params"] == {"request_rate": 8, "burst_factor": 5}),
                         [0.5, 0.5])
        directory = self.copy_fixture("online")
        with open(os.path.join(directory, "results.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        result = run_tool(directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(directory, "report.md"), encoding="utf-8") as f:
            markdown = f.read()
        self.assertIn("| speculation | request_rate | burst_factor | output tok/s |", markdown)
        self.assertIn("| draft k=2 | 8 | 5 | 512.0 | 768.0 | 160.0 | 900.0 |", markdown)
        self.assertIn("| 80% | 0 | 50% |", markdown)


class CapacityArithmeticTest(unittest.TestCase):
    def test_replicas_needed(self):
        self.assertEqual(results.replicas_needed(100, 10), 10)   # exact multiple
        self.assertEqual(results.replicas_needed(100, 7.5), 14)  # 13.33 rounds up
        self.assertEqual(results.replicas_needed(0.3, 0.1), 3)   # exact in decimal, not in binary
        self.assertEqual(results.replicas_needed(100, 8), 13)
        self.assertEqual(results.replicas_needed(5, 10), 1)

    def test_cost_per_million_tokens(self):
        # 14 replicas at $2.50/h = $35/h for 100 req/s x 128 tokens x 3600 s = 46.08 M tokens/h.
        self.assertAlmostEqual(results.cost_per_million_tokens(14, 2.5, 100, 128), 35 / 46.08)
        self.assertAlmostEqual(results.cost_per_million_tokens(1, 3.6, 1, 1000), 1.0)

    def test_offline_ignores_ttft(self):
        p = {"tpot_ms": {"p99": 30}, "ttft_ms": {"p99": 5000}, "e2e_ms": {"p99": 9000}}
        slo = {"ttft_ms": 500.0, "tpot_ms": 40.0, "e2el_ms": 1000.0}
        self.assertTrue(results.meets_slo(p, slo, queue_free=False))
        self.assertFalse(results.meets_slo(p, slo))
        self.assertFalse(results.meets_slo(p, {"tpot_ms": 20.0}, queue_free=False))

    def test_offline_no_configuration_meets_the_slo(self):
        points = results.aggregate(read_records("offline"))
        options = results.offline_qps(points, {"tpot_ms": 1.0})
        self.assertTrue(all(o["qps"] is None for o in options))
        self.assertIsNone(results.capacity_plan(options, [10], 2.5)[0]["replicas"])

    def test_labels(self):
        def point(method, k):
            return {"spec_method": method, "num_spec_tokens": k}
        self.assertEqual([results.label(point(*a)) for a in [("none", None), ("draft", 4), ("draft", 0),
                                                             ("ngram", 2), ("ngram", 0)]],
                         ["none", "draft k=4", "draft auto", "ngram k=2", "ngram auto"])


class BadInputTest(TempDirTest):
    def assert_one_line_error(self, result, *fragments):
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        for fragment in fragments:
            self.assertIn(fragment, result.stderr)

    def test_missing_dir(self):
        missing = os.path.join(self.tmp, "nope")
        self.assert_one_line_error(run_tool(missing), missing)

    def test_missing_and_empty_results(self):
        directory = self.copy_fixture("offline")
        path = os.path.join(directory, "results.jsonl")
        os.remove(path)
        self.assert_one_line_error(run_tool(directory), "results.jsonl", "not found")
        open(path, "w").close()
        self.assert_one_line_error(run_tool(directory), "results.jsonl", "no results")

    def test_malformed_middle_line(self):
        directory = self.copy_fixture("offline")
        path = os.path.join(directory, "results.jsonl")
        with open(path) as f:
            lines = f.readlines()
        lines[4] = '{"key": "x", oops\n'
        with open(path, "w") as f:
            f.writelines(lines)
        self.assert_one_line_error(run_tool(directory), "results.jsonl:5:")
        lines[4] = '[1, 2]\n'  # JSON, but not a result
        with open(path, "w") as f:
            f.writelines(lines)
        self.assert_one_line_error(run_tool(directory), "results.jsonl:5:")
        lines[4] = json.dumps(dict(json.loads(lines[5]), output_tok_s="fast")) + "\n"
        with open(path, "w") as f:
            f.writelines(lines)
        self.assert_one_line_error(run_tool(directory), "results.jsonl:5:", "output_tok_s")

    def test_truncated_last_line_is_skipped(self):
        directory = self.copy_fixture("offline")
        path = os.path.join(directory, "results.jsonl")
        with open(path) as f:
            last = f.readlines()[-1]
        with open(path, "a") as f:
            f.write(last[:len(last) // 2])  # a write cut short: no newline
        result = run_tool(directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("warning", result.stderr)
        self.assertIn("results.jsonl:19:", result.stderr)
        self.assertTrue(os.path.exists(os.path.join(directory, "report.md")))

    def test_malformed_last_line_with_newline_is_an_error(self):
        directory = self.copy_fixture("offline")
        with open(os.path.join(directory, "results.jsonl"), "a") as f:
            f.write('{"key": \n')
        self.assert_one_line_error(run_tool(directory), "results.jsonl:19:")

    def test_bad_flags(self):
        directory = self.copy_fixture("offline")
        self.assert_one_line_error(run_tool(directory, "--target-qps", "10,abc"), "--target-qps")
        self.assert_one_line_error(run_tool(directory, "--target-qps", "0"), "--target-qps")
        self.assert_one_line_error(run_tool(directory, "--cost-per-hour", "-1"), "--cost-per-hour")
        self.assertFalse(os.path.exists(os.path.join(directory, "report.md")))

    def test_bad_run_json(self):
        directory = self.copy_fixture("offline")
        with open(os.path.join(directory, "run.json"), "w") as f:
            f.write("{")
        self.assert_one_line_error(run_tool(directory), "run.json")

    def test_help(self):
        result = run_tool("--help")
        self.assertEqual(result.returncode, 0)
        for flag in ("--out", "--target-qps", "--cost-per-hour", "DIR"):
            self.assertIn(flag, result.stdout)


if __name__ == "__main__":
    unittest.main()
