"""/metrics read with prometheus_client agrees with the requests sent; SIGTERM drains: readiness
(gRPC health for "" and specula.v1.Generation, HTTP /health) turns NOT_SERVING while liveness (the
"liveness" service, HTTP /live) stays SERVING, new requests get UNAVAILABLE / 503, requests in flight
complete, and the exit status is 0."""
import concurrent.futures
import time
import unittest
import urllib.error
import urllib.request

import grpc

from serving_util import DRAFT, PROMPTS, Serve, metric, metrics, random_model, stubs, time_scale

pb, pb_grpc = stubs()


class MetricsTest(unittest.TestCase):
    def test_counters_agree_with_requests(self):
        with Serve("--spec-method", "draft", "--draft-model", DRAFT, "--num-spec-tokens", "3") as s, \
                grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            lasts = []
            for p in PROMPTS[:6]:  # 6 that run to max_tokens
                req = pb.GenerateRequest(prompt=p, sampling=pb.SamplingParams(max_tokens=12, ignore_eos=True))
                msgs = list(stub.Generate(req, timeout=60 * time_scale()))
                lasts.append(msgs[-1])
            for bad in (pb.SamplingParams(temperature=-1), pb.SamplingParams(top_k=-1)):  # 2 refused
                with self.assertRaises(grpc.RpcError):
                    list(stub.Generate(pb.GenerateRequest(prompt="x", sampling=bad), timeout=10 * time_scale()))
            m = metrics(s.http_base)
            self.assertEqual(metric(m, "specula:request_success_total", finished_reason="length"), 6)
            self.assertEqual(metric(m, "specula:request_success_total", finished_reason="stop"), 0)
            self.assertEqual(metric(m, "specula:generation_tokens_total"), 6 * 12)
            self.assertEqual(metric(m, "specula:prompt_tokens_total"), sum(l.usage.prompt_tokens for l in lasts))
            self.assertEqual(metric(m, "specula:admission_rejected_total", reason="invalid_argument"), 2)
            self.assertEqual(metric(m, "specula:time_to_first_token_seconds_count"), 6)
            self.assertEqual(metric(m, "specula:e2e_request_latency_seconds_count"), 6)
            # vLLM's phase histograms: one observation per request that ran (the refused ones never
            # queued); the prefill and decode phases add up to the inference phase.
            for phase in ("queue", "prefill", "decode", "inference"):
                self.assertEqual(metric(m, f"specula:request_{phase}_time_seconds_count"), 6, phase)
                self.assertEqual(metric(m, f"specula:request_{phase}_time_seconds_bucket", le="+Inf"), 6, phase)
            self.assertAlmostEqual(metric(m, "specula:request_prefill_time_seconds_sum") +
                                   metric(m, "specula:request_decode_time_seconds_sum"),
                                   metric(m, "specula:request_inference_time_seconds_sum"), places=6)
            self.assertLessEqual(metric(m, "specula:request_queue_time_seconds_sum") +
                                 metric(m, "specula:request_inference_time_seconds_sum"),
                                 metric(m, "specula:e2e_request_latency_seconds_sum") + 1e-6)
            # As vLLM V1: one inter-token latency per step that gave a running request tokens; a
            # verification step gives 1 to k + 1 = 4 of them.
            itl = metric(m, "specula:time_per_output_token_seconds_count")
            self.assertLessEqual(itl, 6 * 11)
            self.assertGreaterEqual(itl, 6 * 11 / 4)
            self.assertEqual(metric(m, "specula:num_requests_running"), 0)
            self.assertEqual(metric(m, "specula:kv_cache_usage_perc"), 0)
            self.assertEqual(metric(m, "specula:spec_decode_num_drafts_total"), sum(l.spec.num_drafts for l in lasts))
            self.assertEqual(metric(m, "specula:spec_decode_num_draft_tokens_total"),
                             sum(l.spec.num_draft_tokens for l in lasts))
            accepted = sum(l.spec.num_accepted_tokens for l in lasts)
            self.assertEqual(metric(m, "specula:spec_decode_num_accepted_tokens_total"), accepted)
            per_pos = sum(metric(m, "specula:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                          for i in range(3))
            self.assertEqual(per_pos, accepted)
            self.assertGreater(metric(m, "specula:prefix_cache_queries_total"), 0)
            self.assertEqual(s.stop(), 0)


class DrainTest(unittest.TestCase):
    def test_sigterm_drains(self):
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        # The drain's limit scales with the sanitizer: 4 x 240 tokens took over 60 s under TSan on a
        # busy 2-core machine.
        with Serve("--drain-timeout-s", int(60 * time_scale()), model=random_model(), tokenizer=None) as s, \
                grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            health = health_pb2_grpc.HealthStub(ch)
            req = pb.GenerateRequest(prompt="Once upon a time", sampling=pb.SamplingParams(max_tokens=240, ignore_eos=True))
            calls = [stub.Generate(req, timeout=120 * time_scale()) for _ in range(4)]
            firsts = [next(c) for c in calls]  # all four are running

            def statuses():  # readiness (the server's and Generation's) and liveness
                return [health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5 * time_scale()).status
                        for name in ("", "specula.v1.Generation", "liveness")]
            serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
            self.assertEqual(statuses(), [serving] * 3)
            s.proc.send_signal(15)
            deadline = time.time() + 10 * time_scale()
            while health.Check(health_pb2.HealthCheckRequest(), timeout=5 * time_scale()).status == health_pb2.HealthCheckResponse.SERVING:
                self.assertLess(time.time(), deadline, "health still SERVING after SIGTERM")
                time.sleep(0.01)
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(req, timeout=10 * time_scale()))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(s.http_base + "/health", timeout=5 * time_scale())
            self.assertEqual(e.exception.code, 503)
            # While it drains the process is alive: liveness stays SERVING (HTTP: /live 200), so a
            # kubelet does not kill it before its requests finish.
            self.assertEqual(statuses(), [not_serving, not_serving, serving])
            self.assertEqual(urllib.request.urlopen(s.http_base + "/live", timeout=5 * time_scale()).status, 200)
            self.assertFalse(all(c.done() for c in calls), "the drain was over before liveness was checked")
            for first, call in zip(firsts, calls):
                msgs = [first, *call]
                self.assertEqual(sum(len(m.token_ids) for m in msgs), 240)
                self.assertEqual(msgs[-1].finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(s.proc.wait(timeout=30 * time_scale()), 0, s.stderr())
            self.assertIn("drained", s.stderr())


if __name__ == "__main__":
    unittest.main()
