"""Overload: `specula bench-serve` offers 3x the measured capacity of a real `specula serve` for 20 s.
The server stays up with bounded RSS; admitted requests meet --ttft-slo-ms at P99; refused ones get
RESOURCE_EXHAUSTED within 10 ms at P99. Under ASan (SPECULA_SANITIZER=asan, from the asan test
preset) the overload lasts 8 s (also under TSan), the SLO and the queue delay are looser for its ~9x
slower server, the refusal latency is printed, not asserted (its OpenMP threads take the CPU from
the gRPC threads), and the RSS bound allows for ASan's quarantine."""
import json
import os
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

from serving_util import BINARY, SANITIZER, Serve, metric, metrics, random_model, rss_mb, time_scale

QUICK = SANITIZER == "asan"
SLO_MS = 6000 if QUICK else 1000
QUEUE_DELAY_MS = 1500 if QUICK else 300
# The target is 10 ms. The bound here is looser: the load generator shares the 2 cores with the
# server, and on these shared machines a run's refusal P99 ranged 3.8-12 ms (README).
REFUSAL_MS = 20
# Under either sanitizer the overload lasts 8 s: what it checks there is the server's code under load,
# not its latency, and 20 s of a TSan server's backlog takes minutes to drain.
SECONDS = 8 if SANITIZER else 20
# ASan keeps up to 256 MB of freed memory in its quarantine (quarantine_size_mb's default) before it
# reuses any, so churn alone grows the RSS by that much there (by 224 MB in one CI run).
RSS_GROWTH_MB = 200 + (256 if SANITIZER == "asan" else 0)
# Under ThreadSanitizer (SPECULA_SANITIZER=tsan) the server is 5-15x slower and its threads are
# serialized by the sanitizer: the latency bounds (admitted P99 TTFT, refusal P99) measure the
# sanitizer, not the server, and are skipped, with a line that says so. Everything else is asserted.
CHECK_LATENCY = SANITIZER != "tsan"
# Under ASan the refusal bound is reported, not asserted: a refusal waits for a gRPC thread, and the
# ~9x slower engine's OpenMP threads hold both cores (P99 36 ms in one CI run, 3.8-12 ms released).
CHECK_REFUSAL = not SANITIZER
# The load goes over gRPC, except under ThreadSanitizer: Debian's gRPC is not built with TSan and
# reports on its threads are suppressed (tests/tsan.supp), so there it goes over HTTP (429 for a
# refusal), whose threads TSan checks against the engine's, admission's and the metrics' code.
PROTOCOL = "http" if SANITIZER == "tsan" else "grpc"
SHAPE = ["--input-len", "16", "--output-len", "32"]


def bench(target, out, *flags):
    subprocess.run([BINARY, "bench-serve", "--endpoint", f"{PROTOCOL}://{target}", "--no-progress", "--result-json", out,
                    *SHAPE, *map(str, flags)], check=True, capture_output=True, text=True, timeout=300 * time_scale())
    with open(out) as f:
        return json.load(f)




class OverloadTest(unittest.TestCase):
    def test_three_times_capacity(self):
        with Serve("--max-num-seqs", "16", "--max-queue-delay-ms", QUEUE_DELAY_MS, "--ttft-slo-ms", SLO_MS,
                   model=random_model(), tokenizer=None) as s, tempfile.TemporaryDirectory() as d:
            # Capacity: closed loop at the batch size (this also gives admission its completion rate).
            target = s.grpc_target if PROTOCOL == "grpc" else s.http_base[len("http://"):]
            # 2 rounds of the batch under TSan, whose capacity only sets the offered rate (4 rounds elsewhere).
            cap = bench(target, os.path.join(d, "cap.json"), "--num-prompts", 32 if SANITIZER == "tsan" else 64,
                        "--max-concurrency", 16)
            self.assertEqual(cap["failed"], 0)
            capacity = cap["request_throughput"]
            rate = 3 * capacity
            base_rss = rss_mb(s.proc.pid)
            peak = [base_rss]
            done = threading.Event()

            def watch():
                while not done.is_set():
                    peak[0] = max(peak[0], rss_mb(s.proc.pid))
                    time.sleep(0.2)

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                over = bench(target, os.path.join(d, "over.json"), "--num-prompts", int(rate * SECONDS),
                             "--request-rate", f"{rate:.2f}", "--seed", 3)
            finally:
                done.set()
                watcher.join()
            print(f"{PROTOCOL}: capacity {capacity:.1f} req/s; offered {rate:.1f} req/s for {SECONDS} s: "
                  f"{over['completed']} completed, {over['rejected']} rejected, {over['failed']} failed; "
                  f"P99 TTFT {over['p99_ttft_ms']:.0f} ms (SLO {SLO_MS}), P99 rejection {over['p99_rejection_ms']:.2f} ms; "
                  f"RSS {base_rss:.0f} -> peak {peak[0]:.0f} MB")
            self.assertIsNone(s.proc.poll(), "the server died")
            self.assertEqual(over["failed"], 0)
            self.assertGreater(over["completed"], 0)
            if CHECK_LATENCY:
                self.assertGreater(over["rejected"], 0, "3x capacity was all admitted")
                self.assertLessEqual(over["p99_ttft_ms"], SLO_MS)
                if CHECK_REFUSAL:
                    self.assertLess(over["p99_rejection_ms"], REFUSAL_MS)
                else:
                    print(f"SKIPPED under {SANITIZER}: P99 refusal < {REFUSAL_MS} ms "
                          f"(measured {over['p99_rejection_ms']:.1f} ms)")
            else:
                # Also whether 3x was refused at all: the capacity measured first under TSan moves with the
                # machine's other load (CI builds and fuzzes beside these tests), and 3x of a slow
                # minute's capacity can all fit in a faster one.
                print(f"SKIPPED under {SANITIZER}: the latency bounds P99 TTFT <= {SLO_MS} ms and P99 refusal "
                      f"< {REFUSAL_MS} ms (measured {over['p99_ttft_ms']:.0f} ms and {over['p99_rejection_ms']:.1f} ms), "
                      f"and that some of 3x capacity is refused ({over['rejected']} refused)")
            self.assertLess(peak[0], base_rss + RSS_GROWTH_MB, "RSS grew without bound")
            m = metrics(s.http_base)
            refused = sum(metric(m, "specula:admission_rejected_total", reason=r)
                          for r in ("queue_len", "queue_delay", "ttft_slo"))
            # The capacity run's refusals count too (none in a quiet run; a few under TSan on a busy machine).
            self.assertEqual(refused, cap["rejected"] + over["rejected"])
            from grpc_health.v1 import health_pb2, health_pb2_grpc
            with grpc.insecure_channel(s.grpc_target) as ch:
                health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5 * time_scale())
            self.assertEqual(health.status, health_pb2.HealthCheckResponse.SERVING)
            self.assertEqual(s.stop(), 0, s.stderr())


if __name__ == "__main__":
    unittest.main()
