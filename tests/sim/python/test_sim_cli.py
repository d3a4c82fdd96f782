"""`specula simulate`, `specula plan` and `specula experiment calibrate` as real processes: the same
seed prints the same bytes, errors name their flag, a calibration (grid and served load) feeds the
simulator, a small ONLINE experiment is validated (CI's small validation: the prediction within a
loose bound of what ran, and the step-time model against the run's own steps), and a plan writes its
report with plots.

Environment: SPECULA_BINARY, SPECULA_SOURCE_DIR, SPECULA_MODELS (as the serving tests).
"""
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
from serving_util import BINARY, SANITIZER, TARGET, TOKENIZER  # noqa: E402

ROOFLINE = ["--device", "h100", "--shape", "llama-3.1-8b", "--input-len", "256", "--output-len", "64"]


def specula(*args, timeout=600):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


class SimulateCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="specula_sim_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_same_seed_same_bytes_and_another_seed_differs(self):
        args = ["simulate", *ROOFLINE, "--request-rate", "20", "--num-prompts", "400", "--spec-method", "draft",
                "--draft-shape", "llama-3.2-1b", "--acceptance", "0.8,0.6", "--acceptance-spread", "10", "--json"]
        a, b = specula(*args, "--seed", "3"), specula(*args, "--seed", "3")
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(a.stdout, b.stdout)
        self.assertNotEqual(a.stdout, specula(*args, "--seed", "4").stdout)
        out = json.loads(a.stdout)
        self.assertEqual(out["cost"]["origin"], "roofline")
        self.assertEqual(out["fleet"]["completed"], 400)
        self.assertGreater(out["fleet"]["mean_k"], 0)

    def test_errors_name_their_flag(self):
        for args, message in [
            (["simulate", "--request-rate", "1"], "--cost FILE, or by --device"),
            (["simulate", *ROOFLINE, "--routing", "random"], "routing 'random'"),
            (["simulate", *ROOFLINE, "--spec-method", "ngram"], "--spec-method needs --acceptance"),
            (["simulate", "--device", "tpu", "--shape", "llama-3.1-8b"], "--device: unknown device 'tpu'"),
            (["simulate", "--cost", "/nonexistent.json"], "--cost: /nonexistent.json: cannot open"),
            (["plan", *ROOFLINE], "plan needs --qps"),
            (["simulate", *ROOFLINE, "--acceptance-spread", "2"], "--acceptance-spread and --propose-us need --spec-method"),
            (["simulate", *ROOFLINE, "--arrival-us", "-5"], "--arrival-us"),
        ]:
            r = specula(*args)
            self.assertEqual(r.returncode, 1, args)
            self.assertIn(message, r.stderr, args)

    def test_calibration_feeds_the_simulator_and_validates_an_online_run(self):
        cost = os.path.join(self.tmp, "cost.json")
        r = specula("experiment", "calibrate", "--model", TARGET, "--tokenizer", TOKENIZER, "--out", cost,
                    "--batches", "1,4,16", "--contexts", "32,128", "--ks", "2", "--steps", "3",
                    "--load", "2,6", "--load-requests", "16", "--no-progress")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(cost) as f:
            calibration = json.load(f)
        steps = calibration["steps"]
        self.assertEqual({s["kind"] for s in steps}, {"prefill", "decode", "verify"})
        # What an arrival adds to the step it lands in: measured, and well under a step of the model.
        self.assertGreaterEqual(calibration["arrival_s"], 0)
        self.assertLess(calibration["arrival_s"], 0.005)
        grid = [s for s in steps if s["phase"] == "grid"]
        load = [s for s in steps if s["phase"] == "load"]
        self.assertEqual(len(grid) + len(load), len(steps))
        # Served traffic: batches of many sizes, and steps where a prompt's chunk runs beside decodes.
        self.assertGreater(len({s["seqs"] for s in load}), 2)
        self.assertTrue(any(s["kind"] == "prefill" and s["seqs"] > 1 for s in load))
        sim = specula("simulate", "--cost", cost, "--request-rate", "50", "--num-prompts", "60", "--input-len", "32",
                      "--output-len", "32", "--max-num-seqs", "16")
        self.assertEqual(sim.returncode, 0, sim.stderr)
        self.assertIn("step times: calibrated", sim.stdout)
        # A small ONLINE experiment, replayed through the simulator.
        spec = os.path.join(self.tmp, "online.textproto")
        with open(spec, "w") as f:
            f.write(f'name: "v"\nmodel {{ path: "{TARGET}" tokenizer: "{TOKENIZER}" }}\n'
                    'workload { synthetic { input_len: 32 output_len: 32 } num_requests: 60 seed: 2 }\n'
                    'mode: ONLINE\nsweep { max_num_seqs: [16] request_rate: [20, 60] }\nrecord_trace: true\n'
                    'slo { ttft_ms: 1000 }\n')
        out = os.path.join(self.tmp, "online")
        r = specula("experiment", "run", spec, "--out", out, "--no-progress")
        self.assertEqual(r.returncode, 0, r.stderr)
        v = specula("simulate", "--validate", out, "--cost", cost, "--json")
        self.assertEqual(v.returncode, 0, v.stderr)
        points = json.loads(v.stdout)["points"]
        self.assertEqual(len(points), 2)
        for p in points:
            for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "output_tok_s", "goodput"):
                self.assertIn(key, p["measured"])
                self.assertIn(key, p["predicted"])
            m, s = p["measured"]["output_tok_s"], p["predicted"]["output_tok_s"]
            # Below capacity both follow the arrivals: a loose bound that a broken replay (lengths,
            # arrivals or step times off by a factor) does not meet.
            self.assertLess(abs(s - m) / m, 0.35, p)
            self.assertEqual(p["predicted"]["completed"], 60)
            # The step-time model against the run's own steps (record_trace wrote them). Loose: a
            # busy machine (tests in parallel) slows a woken loop's prefill several times; a unit
            # or a count gone wrong is off by far more.
            st = p["step_times"]["all"]
            self.assertGreater(st["steps"], 10)
            self.assertEqual(set(p["step_times"]) - {"all"}, {"prefill", "decode"})
            self.assertLess(abs(math.log(st["predicted_s"] / st["measured_s"])), math.log(10), p["step_times"])
        # The simulated steps beside the measured ones, in the same format.
        steps_dir = os.path.join(self.tmp, "sim_steps")
        os.mkdir(steps_dir)
        r = specula("simulate", "--validate", out, "--cost", cost, "--steps-out", steps_dir, "--step-jitter")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("step times, the model over the runs' own steps", r.stdout)
        for i in range(2):
            with open(os.path.join(steps_dir, f"point-{i}.steps.jsonl")) as f:
                sim_steps = [json.loads(line) for line in f]
            self.assertGreater(len(sim_steps), 10)
            self.assertEqual(set(sim_steps[0]), {"start_s", "seconds", "kind", "seqs", "tokens", "rows", "positions"})
            # And its requests, as the run's trace has them: every one, in arrival order, each
            # first token after its arrival and before its last.
            with open(os.path.join(steps_dir, f"point-{i}.jsonl")) as f:
                sim_requests = [json.loads(line) for line in f]
            self.assertEqual(len(sim_requests), 60)
            arrivals = [q["arrival_s"] for q in sim_requests]
            self.assertEqual(arrivals, sorted(arrivals))
            for q in sim_requests:
                self.assertTrue(q["ok"], q)
                self.assertGreater(q["output_tokens"], 0, q)
                self.assertGreater(q["ttft_ms"], 0, q)
                self.assertLessEqual(q["ttft_ms"], q["e2e_ms"], q)
                self.assertAlmostEqual(q["finish_s"], q["arrival_s"] + q["e2e_ms"] / 1e3, places=9)

    def small_ngram_run(self, record_trace):
        """A small calibration of the tiny model and one ONLINE n-gram point (k = 2): (cost file, the
        experiment's directory, its results line)."""
        cost = os.path.join(self.tmp, "cost.json")
        r = specula("experiment", "calibrate", "--model", TARGET, "--tokenizer", TOKENIZER, "--out", cost,
                    "--batches", "1,4", "--contexts", "32", "--ks", "2", "--steps", "3", "--load", "2", "--load-requests", "8",
                    "--no-progress")
        self.assertEqual(r.returncode, 0, r.stderr)
        spec = os.path.join(self.tmp, "spec.textproto")
        with open(spec, "w") as f:
            f.write(f'name: "a"\nmodel {{ path: "{TARGET}" tokenizer: "{TOKENIZER}" }}\n'
                    'workload { synthetic { input_len: 32 output_len: 48 } num_requests: 20 seed: 3 }\n'
                    'mode: ONLINE\nsweep { spec_method: ["ngram"] num_spec_tokens: [2] request_rate: [40] }\n'
                    + ('record_trace: true\n' if record_trace else ''))
        out = os.path.join(self.tmp, "online")
        r = specula("experiment", "run", spec, "--out", out, "--no-progress")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "results.jsonl")) as f:
            return cost, out, json.loads(f.readline())

    def test_validation_replays_each_drafts_acceptance_given_those_before(self):
        # A speculative ONLINE point records, per draft position, the verifications that reached it
        # and those that accepted it; --validate replays their ratio. Set to all accepted or none,
        # the same point's replay takes fewer steps with all.
        cost, out, run = self.small_ngram_run(record_trace=False)
        self.assertEqual(len(run["spec"]["reached_per_position"]), len(run["spec"]["accepted_per_position"]))
        steps, acceptance, replays = {}, {}, {}
        for name, accepted in (("all", lambda n: n), ("none", lambda n: 0), ("half", lambda n: n // 2)):
            doctored = dict(run, spec=dict(run["spec"], drafts=50, reached_per_position=[50, 50],
                                           accepted_per_position=[accepted(50), accepted(50)]))
            d = os.path.join(self.tmp, name)
            os.mkdir(d)
            shutil.copy(os.path.join(out, "run.json"), d)
            with open(os.path.join(d, "results.jsonl"), "w") as f:
                f.write(json.dumps(doctored) + "\n")
            v = specula("simulate", "--validate", d, "--cost", cost, "--json")
            self.assertEqual(v.returncode, 0, v.stderr)
            predicted = json.loads(v.stdout)["points"][0]["predicted"]
            replays[name] = predicted
            steps[name] = predicted["steps"]
            acceptance[name] = predicted["accepted_tokens"] / predicted["draft_tokens"]
        self.assertEqual(acceptance["all"], 1.0, acceptance)
        self.assertEqual(acceptance["none"], 0.0, acceptance)
        self.assertTrue(0.2 < acceptance["half"] < 0.8, acceptance)
        # Fewer steps with every draft accepted, where the calibration's steps are short beside the
        # arrivals' gaps (one request at a time). A sanitizer's steps are 3-10x longer: requests then
        # overlap, and the step count follows the batching as much as the acceptance.
        if not SANITIZER:
            self.assertLess(steps["all"], 0.8 * steps["none"], steps)
        # --acceptance-spread varies the measured acceptance per request, which changes the replay (its
        # tokens accepted, steps and latencies; the step count alone can come out equal where requests
        # overlap); a bad value is named.
        half = os.path.join(self.tmp, "half")
        v = specula("simulate", "--validate", half, "--cost", cost, "--json", "--acceptance-spread", "0.5")
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertNotEqual(json.loads(v.stdout)["points"][0]["predicted"], replays["half"])
        v = specula("simulate", "--validate", half, "--cost", cost, "--acceptance-spread", "wide")
        self.assertEqual(v.returncode, 1)
        self.assertIn("--acceptance-spread: 'wide' is not a number >= 0", v.stderr)

    def test_an_ngram_trace_replays_the_runs_drafts_step_by_step(self):
        # An n-gram point's trace records what the lookup found and matched at each decode step; with
        # a fixed k, --validate and `simulate --acceptance trace` draft and accept what the run did.
        cost, out, run = self.small_ngram_run(record_trace=True)
        self.assertGreater(run["spec"]["accepted_tokens"], 5, run["spec"])
        v = specula("simulate", "--validate", out, "--cost", cost, "--json")
        self.assertEqual(v.returncode, 0, v.stderr)
        point = json.loads(v.stdout)["points"][0]
        for key in ("draft_tokens", "accepted_tokens"):
            self.assertEqual(point["predicted"][key], run["spec"][key], key)
        trace = os.path.join(out, run["trace"])
        v = specula("simulate", "--trace", trace, "--cost", cost, "--spec-method", "ngram", "--num-spec-tokens", "2",
                    "--acceptance", "trace", "--max-num-seqs", "64", "--json")
        self.assertEqual(v.returncode, 0, v.stderr)
        fleet = json.loads(v.stdout)["fleet"]
        self.assertEqual((fleet["draft_tokens"], fleet["accepted_tokens"]),
                         (run["spec"]["draft_tokens"], run["spec"]["accepted_tokens"]))
        # A numeric acceptance says that the trace's drafts are not replayed; `trace` is refused by name
        # where it cannot apply.
        v = specula("simulate", "--trace", trace, "--cost", cost, "--spec-method", "ngram", "--acceptance", "0.5")
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertIn("drafts_found and drafts_matched are not replayed", v.stderr)
        v = specula("simulate", "--cost", cost, "--spec-method", "ngram", "--acceptance", "trace")
        self.assertEqual(v.returncode, 1)
        self.assertIn("--acceptance trace replays a --trace's n-gram drafts", v.stderr)

    def test_plan_writes_the_report_and_prefers_the_cheaper_fleet(self):
        cands = os.path.join(self.tmp, "c.json")
        with open(cands, "w") as f:
            json.dump([{"name": "h100", "price_per_hour": 4.0,
                        "flags": "--device h100 --shape llama-3.1-8b --max-num-seqs 128"},
                       {"name": "h100-pricey", "price_per_hour": 40.0,
                        "flags": "--device h100 --shape llama-3.1-8b --max-num-seqs 128"}], f)
        out = os.path.join(self.tmp, "plan")
        r = specula("plan", "--qps", "200,2000", "--candidates", cands, "--input-len", "256", "--output-len", "64",
                    "--slo-ttft-p99-ms", "300", "--sim-duration-s", "20", "--out", out, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = json.loads(r.stdout)
        self.assertEqual(plan["cheapest"], [0, 0])
        a = plan["candidates"][0]["at"]
        self.assertGreater(a[1]["replicas"], a[0]["replicas"])
        self.assertIn("one replica simulated at its share", plan["note"])
        self.assertIn("roofline", plan["candidates"][0]["source"])
        for name in ("plan.json", "plan.md", "plan_p99_vs_load.png", "plan_replicas_vs_qps.png", "plan_cost_vs_slo.png"):
            self.assertTrue(os.path.exists(os.path.join(out, name)), name)


if __name__ == "__main__":
    unittest.main()
