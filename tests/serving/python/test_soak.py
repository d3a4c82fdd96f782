"""Soak (label `soak`, not run in CI): a real `specula serve` under `specula bench-serve` at 80% of its
measured capacity for SPECULA_SOAK_SECONDS (default 600), in 60 s segments that each carry a 3x
burst, while a side client sends cancels (streams dropped after a few messages) and malformed
requests. The server's RSS is sampled every 10 s.

At the end: RSS grew less than 5% from the end of the warm-up (the first fifth of the run) to the
largest sample after it; the KV cache is empty and nothing runs or waits; every admitted valid
request completed (bench-serve counts no failure, and every side request that was neither cancelled
nor malformed ran to its length); malformed ones got INVALID_ARGUMENT; the server is healthy and
drains with exit status 0. The figures go to stdout (and SPECULA_SOAK_JSON, when set) for the README.

    ctest --test-dir build/release -L soak -V          # 10 minutes + ~30 s of setup
    SPECULA_SOAK_SECONDS=60 python3 tests/serving/python/test_soak.py -v   # a short rehearsal
"""
import json
import os
import random
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

from serving_util import BINARY, Serve, metric, random_model, rss_mb, stubs, time_scale, wait_kv_empty

pb, pb_grpc = stubs()

SECONDS = int(os.environ.get("SPECULA_SOAK_SECONDS", "600"))
SEGMENT_S = min(60, SECONDS)
LOAD = 0.8                 # of the measured capacity
BURST = (3.0, 5.0)         # factor, seconds: once per segment, at a random start
SIDE_RATE = 2.0            # side requests/s: 3 in 4 are cancelled mid-stream, 1 in 4 malformed
SAMPLE_S = 10
SHAPE = ["--input-len", "16", "--output-len", "32"]
MALFORMED = [
    ({"prompt": "hi", "sampling": {"temperature": -1.0}}, "sampling.temperature"),
    ({"prompt_token_ids": [5, 10 ** 6]}, "prompt_token_ids[1]"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "hi", "sampling": {"stop": ["ok", ""]}}, "sampling.stop[1]"),
]




def bench(target, out, *flags):
    p = subprocess.run([BINARY, "bench-serve", "--endpoint", f"grpc://{target}", "--no-progress", "--result-json", out,
                        *SHAPE, *map(str, flags)], capture_output=True, text=True, timeout=SEGMENT_S * 5 + 300)
    if p.returncode != 0:
        raise AssertionError(f"bench-serve exited {p.returncode}:\n{p.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


class SoakTest(unittest.TestCase):
    def test_soak(self):
        with Serve("--max-num-seqs", "16", "--max-queue-delay-ms", "500", model=random_model(), tokenizer=None) as s, \
                tempfile.TemporaryDirectory() as d, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            cap = bench(s.grpc_target, os.path.join(d, "cap.json"), "--num-prompts", 96, "--max-concurrency", 16)
            self.assertEqual(cap["failed"], 0)
            capacity = cap["request_throughput"]
            rate = LOAD * capacity
            print(f"capacity {capacity:.1f} req/s (closed loop, 16 in flight); soak at {rate:.1f} req/s for "
                  f"{SECONDS} s, a {BURST[0]:.0f}x burst of {BURST[1]:.0f} s in every {SEGMENT_S} s", flush=True)

            stop = threading.Event()
            samples = []  # (seconds from the start, RSS MB)
            side = []     # (kind, outcome, tokens, max_tokens, detail)
            start = time.time()

            def sample():
                while True:
                    samples.append((time.time() - start, rss_mb(s.proc.pid)))
                    if stop.wait(SAMPLE_S):
                        return

            def side_request(i):
                r = random.Random(i)
                kind = "malformed" if i % 4 == 3 else "cancel"
                max_tokens = 64
                req = pb.GenerateRequest(request_id=f"soak-side-{i}",
                                         prompt_token_ids=[r.randint(1, 31000) for _ in range(r.randint(1, 24))],
                                         sampling=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True))
                field = None
                if kind == "malformed":
                    fields, field = MALFORMED[i % len(MALFORMED)]
                    req = pb.GenerateRequest(**{k: (pb.SamplingParams(**v) if k == "sampling" else v)
                                                for k, v in fields.items()})
                tokens, cancel_after = 0, r.randint(1, 3)
                try:
                    call = stub.Generate(req, timeout=120 * time_scale())
                    last = None
                    for n, msg in enumerate(call, 1):
                        tokens += len(msg.token_ids)
                        last = msg
                        if kind == "cancel" and n == cancel_after:
                            call.cancel()
                    side.append((kind, "ok", tokens, max_tokens, last.finish_reason if last else None))
                except grpc.RpcError as e:
                    side.append((kind, e.code(), tokens, max_tokens, field if kind == "malformed" else e.details()))
                    if kind == "malformed":
                        self.assertIn(field, e.details())

            def side_client():
                rng, i, threads = random.Random(11), 0, []
                while not stop.wait(rng.expovariate(SIDE_RATE)):
                    th = threading.Thread(target=side_request, args=(i,))
                    th.start()
                    threads.append(th)
                    i += 1
                for th in threads:
                    th.join(timeout=180 * time_scale())

            sampler = threading.Thread(target=sample)
            sider = threading.Thread(target=side_client)
            sampler.start()
            sider.start()
            segments = []
            try:
                seg = 0
                while time.time() - start < SECONDS - 1:
                    seconds = min(SEGMENT_S, SECONDS - (time.time() - start))
                    burst_at = random.Random(seg).uniform(0, max(0.0, seconds - BURST[1]))
                    segments.append(bench(s.grpc_target, os.path.join(d, f"seg{seg}.json"),
                                          "--num-prompts", max(1, int(rate * seconds)), "--request-rate", f"{rate:.3f}",
                                          "--burst-factor", BURST[0], "--burst-start-s", f"{burst_at:.1f}",
                                          "--burst-duration-s", BURST[1], "--seed", 100 + seg))
                    seg += 1
            finally:
                stop.set()
                sider.join()
                sampler.join()
            elapsed = time.time() - start
            self.assertIsNone(s.proc.poll(), "the server died")

            # Every admitted valid request completed.
            sent = sum(x["num_prompts"] for x in segments)
            completed = sum(x["completed"] for x in segments)
            rejected = sum(x["rejected"] for x in segments)
            failed = sum(x["failed"] for x in segments)
            self.assertEqual(failed, 0, "bench-serve requests failed")
            self.assertEqual(completed + rejected, sent)
            for kind, outcome, tokens, max_tokens, detail in side:
                if kind == "malformed":
                    self.assertEqual(outcome, grpc.StatusCode.INVALID_ARGUMENT, detail)
                elif outcome == "ok":  # the cancel came after the last token
                    self.assertEqual(tokens, max_tokens)
                else:
                    self.assertIn(outcome, (grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED), detail)
            cancelled = sum(1 for x in side if x[1] == grpc.StatusCode.CANCELLED)
            malformed = sum(1 for x in side if x[0] == "malformed")
            self.assertGreater(cancelled, 0)

            # The KV cache is empty once the last streams end (a cancel frees its blocks within a step).
            m = wait_kv_empty(self, s.http_base, 10 * time_scale(), "the soak")

            warm = [r for t, r in samples if t <= SECONDS / 5]
            after = [r for t, r in samples if t > SECONDS / 5]
            baseline = warm[-1]
            peak_after = max(after) if after else baseline
            growth = (peak_after - baseline) / baseline
            p99_ttft = max(x["p99_ttft_ms"] for x in segments)
            summary = {
                "seconds": round(elapsed, 1), "capacity_req_s": round(capacity, 2), "rate_req_s": round(rate, 2),
                "sent": sent, "completed": completed, "rejected": rejected, "failed": failed,
                "side_requests": len(side), "cancelled": cancelled, "malformed": malformed,
                "rss_mb": [round(r, 1) for _, r in samples], "rss_warmup_mb": round(baseline, 1),
                "rss_peak_after_warmup_mb": round(peak_after, 1), "rss_growth_pct": round(100 * growth, 2),
                "worst_segment_p99_ttft_ms": round(p99_ttft, 1),
                "prompt_tokens": metric(m, "specula:prompt_tokens_total"),
                "generation_tokens": metric(m, "specula:generation_tokens_total"),
            }
            print("soak:", json.dumps(summary), flush=True)
            if os.environ.get("SPECULA_SOAK_JSON"):
                with open(os.environ["SPECULA_SOAK_JSON"], "w") as f:
                    json.dump(summary, f, indent=1)
            self.assertLess(growth, 0.05, f"RSS grew {100 * growth:.1f}% after the warm-up: {summary['rss_mb']}")

            from grpc_health.v1 import health_pb2, health_pb2_grpc
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5 * time_scale())
            self.assertEqual(health.status, health_pb2.HealthCheckResponse.SERVING)
            self.assertEqual(s.stop(), 0, s.stderr())


if __name__ == "__main__":
    unittest.main()
