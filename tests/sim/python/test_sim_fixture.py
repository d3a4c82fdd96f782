"""The committed ONLINE fixture (tests/fixtures/sim_online) through `specula simulate`, by way of
bench/sim_identity.sh, the check for changes that must not move the simulator's output: the same
build twice prints the same bytes; the replay's measured figures are the fixture's own results and
every request completes; the fixed-flags fleet accounts for every request; a changed or failing build
is reported; the fixture replays the same from another folder and names no path of the machine that
made it.

Environment: SPECULA_BINARY, SPECULA_SOURCE_DIR (as the serving tests).
"""
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ.get("SPECULA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../..")))
sys.path.insert(0, os.path.join(SOURCE, "tests/serving/python"))
from serving_util import BINARY  # noqa: E402

FIXTURE = os.path.join(SOURCE, "tests/fixtures/sim_online")
SCRIPT = os.path.join(SOURCE, "bench/sim_identity.sh")
# A measured metric of --validate and its path in a results line.
MEASURED = {"ttft_p50_ms": ("ttft_ms", "p50"), "ttft_p99_ms": ("ttft_ms", "p99"), "tpot_p50_ms": ("tpot_ms", "p50"),
            "tpot_p99_ms": ("tpot_ms", "p99"), "output_tok_s": ("output_tok_s",), "goodput": ("goodput",),
            "refused": ("rejected",), "draft_tokens": ("spec", "draft_tokens"),
            "accepted_tokens": ("spec", "accepted_tokens")}


def identity(old, new, out):
    return subprocess.run(["bash", SCRIPT, old, new, out], capture_output=True, text=True, timeout=120)


def results():
    with open(os.path.join(FIXTURE, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def at(line, path):
    for key in path:
        line = line[key]
    return line


class SimFixtureTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="specula_sim_fixture_")
        self.out = os.path.join(self.tmp, "out")
        r = identity(BINARY, BINARY, self.out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.report = r.stdout

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def output(self, name, which="old"):
        with open(os.path.join(self.out, f"{name}.{which}.json")) as f:
            return json.load(f)

    def test_the_same_build_twice_prints_the_same_bytes(self):
        lines = self.report.splitlines()
        self.assertEqual([line.split(":")[0] for line in lines], ["validate", "fleet"], self.report)
        for line in lines:
            self.assertIn(": identical (", line)
        for name in ("validate", "fleet"):
            with open(os.path.join(self.out, f"{name}.old.json"), "rb") as a, \
                    open(os.path.join(self.out, f"{name}.new.json"), "rb") as b:
                old = a.read()
                self.assertGreater(len(old), 1000, name)
                self.assertEqual(old, b.read(), name)

    def test_the_replay_measures_the_fixtures_results_and_completes_every_request(self):
        v = self.output("validate")
        self.assertEqual(v["cost"]["origin"], "calibrated")
        self.assertIn("tests/fixtures/sim_online/cost.json", v["cost"]["description"])
        runs = results()
        self.assertEqual(len(v["points"]), len(runs))
        self.assertEqual([p["params"]["spec_method"] for p in v["points"]], ["none", "draft"])
        for point, run in zip(v["points"], runs):
            self.assertEqual(point["params"], run["point"])
            self.assertEqual(point["measured"]["repeats"], 1)
            for key, path in MEASURED.items():
                self.assertEqual(point["measured"][key], at(run, path), key)
            predicted = point["predicted"]
            self.assertEqual(predicted["completed"], run["completed"])
            self.assertEqual(predicted["completed"], run["num_requests"])
            self.assertEqual(predicted["refused"], 0)
            for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "output_tok_s"):
                self.assertTrue(math.isfinite(predicted[key]) and predicted[key] > 0, (key, predicted))
            self.assertLessEqual(predicted["ttft_p50_ms"], predicted["ttft_p99_ms"])
            # The model over every step the run recorded beside its trace.
            with open(os.path.join(FIXTURE, run["trace"][:-len(".jsonl")] + ".steps.jsonl")) as f:
                recorded = sum(1 for _ in f)
            self.assertEqual(point["step_times"]["all"]["steps"], recorded)
            self.assertEqual(recorded, run["steps"])
        none, draft = (p["predicted"] for p in v["points"])
        self.assertEqual(none["draft_tokens"], 0)
        self.assertGreater(draft["draft_tokens"], 0)
        self.assertLess(draft["accepted_tokens"], draft["draft_tokens"])

    def test_the_fleet_accounts_for_every_request(self):
        f = self.output("fleet")
        self.assertEqual(f["replicas"], 16)
        self.assertEqual(f["speculation"], "draft k=2")
        fleet, replicas = f["fleet"], f["per_replica"]
        self.assertEqual(len(replicas), 16)
        self.assertEqual(fleet["requests"], 3000)
        self.assertEqual(fleet["completed"] + fleet["refused"], 3000)
        # The flags overload the fleet on a small KV pool: both paths run.
        self.assertGreater(fleet["refused"], 0)
        self.assertGreater(fleet["preemptions"], 0)
        for key in ("requests", "completed", "refused", "preemptions", "draft_tokens", "accepted_tokens"):
            self.assertEqual(sum(r[key] for r in replicas), fleet[key], key)
        self.assertTrue(all(r["requests"] > 0 for r in replicas))
        self.assertLess(fleet["accepted_tokens"], fleet["draft_tokens"])
        self.assertGreater(fleet["mean_k"], 1)
        self.assertLessEqual(fleet["mean_k"], 2)
        self.assertLessEqual(fleet["ttft_p50_ms"], fleet["ttft_p99_ms"])

    def test_a_changed_or_failing_build_is_reported(self):
        changed = os.path.join(self.tmp, "changed.sh")
        with open(changed, "w") as f:
            f.write(f'#!/bin/sh\n"{BINARY}" "$@" | sed s/1/2/\n')
        os.chmod(changed, 0o755)
        r = identity(BINARY, changed, os.path.join(self.tmp, "changed"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count(": differ ("), 2, r.stdout)
        r = identity("/bin/false", BINARY, os.path.join(self.tmp, "failing"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("the old build exited 1"), 2, r.stdout)

    def test_the_fixture_replays_the_same_from_another_folder(self):
        copy = os.path.join(self.tmp, "copy")
        shutil.copytree(FIXTURE, copy)
        r = subprocess.run([BINARY, "simulate", "--validate", copy, "--cost", os.path.join(copy, "cost.json"), "--json"],
                           capture_output=True, text=True, timeout=60, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["points"], self.output("validate")["points"])
        # Small, and no absolute path of the machine that made it (the model paths are the source
        # tree's models/).
        files = [p for p in glob.glob(os.path.join(FIXTURE, "**"), recursive=True) if os.path.isfile(p)]
        self.assertLess(sum(os.path.getsize(p) for p in files), 500_000)
        for p in files:
            if p.endswith((".json", ".jsonl")):
                with open(p) as f:
                    self.assertNotIn('"/', f.read(), p)


if __name__ == "__main__":
    unittest.main()
