"""A real `specula serve` driven by the grpcio client: greedy output equals offline generation for 20
concurrent requests (with and without speculation), errors name their field, cancellation and
deadlines free the KV cache, health and reflection answer, every Generation call names the replica."""
import concurrent.futures
import time
import unittest
import urllib.request

import grpc

from serving_util import DRAFT, PROMPTS, Serve, metric, metrics, offline_greedy, random_model, stubs, time_scale

pb, pb_grpc = stubs()
MAX_TOKENS = 48


def generate(stub, prompt, **kw):
    """All messages of one Generate call."""
    sampling = pb.SamplingParams(temperature=0.0, max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                                 ignore_eos=kw.pop("ignore_eos", False))
    return list(stub.Generate(pb.GenerateRequest(prompt=prompt, sampling=sampling, **kw), timeout=120 * time_scale()))


class GrpcTest(unittest.TestCase):
    def check_concurrent_greedy(self, *flags):
        expected = offline_greedy(PROMPTS, MAX_TOKENS)
        with Serve(*flags) as s, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
                results = list(pool.map(lambda p: generate(stub, p), PROMPTS))
            for i, msgs in enumerate(results):
                tokens = [t for m in msgs for t in m.token_ids]
                self.assertEqual(tokens, expected[i], f"prompt {i} ({PROMPTS[i]!r}) with {flags}")
                last = msgs[-1]
                self.assertIn(last.finish_reason, (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH))
                self.assertEqual(last.usage.completion_tokens, len(tokens))
                self.assertGreater(last.usage.prompt_tokens, 0)
                self.assertTrue(all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED for m in msgs[:-1]))
                self.assertEqual("".join(m.text for m in msgs).strip() != "", len(tokens) > 0)
            drafts = sum(r[-1].spec.num_drafts for r in results)
            self.assertEqual(s.stop(), 0, s.stderr())
        return drafts

    def test_concurrent_greedy_equals_offline(self):
        self.assertEqual(self.check_concurrent_greedy(), 0)

    def test_concurrent_greedy_equals_offline_with_draft_speculation(self):
        drafts = self.check_concurrent_greedy("--spec-method", "draft", "--draft-model", DRAFT, "--num-spec-tokens", "4")
        self.assertGreater(drafts, 0)

    def test_concurrent_greedy_equals_offline_with_auto_ngram(self):
        self.check_concurrent_greedy("--spec-method", "ngram", "--num-spec-tokens", "auto")

    def test_errors_name_the_field(self):
        with Serve() as s, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            cases = [
                (pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(temperature=-1)), "sampling.temperature"),
                (pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(top_p=1.5)), "sampling.top_p"),
                (pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(max_tokens=-3)), "sampling.max_tokens"),
                (pb.GenerateRequest(prompt_token_ids=[1, 99999]), "prompt_token_ids[1]: 99999"),
                (pb.GenerateRequest(), "prompt"),
                (pb.GenerateRequest(prompt="hi", prompt_token_ids=[1]), "prompt and prompt_token_ids"),
            ]
            for req, field in cases:
                with self.assertRaises(grpc.RpcError) as e:
                    list(stub.Generate(req, timeout=10 * time_scale()))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, field)
                self.assertIn(field, e.exception.details())
            # The server is unharmed.
            self.assertGreater(len(generate(stub, "Once upon a time")), 0)

    def test_stop_string_spanning_tokens_is_never_partly_streamed(self):
        # Greedy "Once upon a time" gives ", there was a little girl named Lily. ...", and " girl" is
        # three tokens of this vocabulary, " g", "ir", "l" (tests/serving/engine_loop_test.cc checks it): the
        # server holds back streamed text that may start a stop string until it knows.
        with Serve() as s, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            plain = "".join(m.text for m in generate(stub, "Once upon a time"))
            self.assertIn(" girl", plain)
            # A later stop, ~40 tokens in: " girl" comes 5 tokens in, and on a fast machine (an
            # AVX-512 Xeon, 2026-11-25) all 24 calls stopping there streamed their text in one piece.
            late = " wanted"
            self.assertIn(late, plain)
            late_ids = stub.Tokenize(pb.TokenizeRequest(text=late), timeout=10 * time_scale()).token_ids
            self.assertGreater(len(late_ids), 1, f"{late!r} must span tokens: {list(late_ids)}")
            pieces = []  # messages with text, per call (several deltas merge while a write is out)
            # At least 4 calls, and more (up to 24) until one streams its text in several messages:
            # on a fast machine the whole text can be ready before the first write completes, and a
            # call in one piece says nothing about held-back text.
            for stops in ([" girl"], ["zzzzzz", " girl"], [late]) * 8:
                if len(pieces) >= 4 and max(pieces) > 1:
                    break
                sampling = pb.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=stops)
                msgs = list(stub.Generate(pb.GenerateRequest(prompt="Once upon a time", sampling=sampling),
                                          timeout=120 * time_scale()))
                self.assertEqual(msgs[-1].finish_reason, pb.FINISH_REASON_STOP)
                streamed = ""
                for m in msgs:
                    streamed += m.text
                    self.assertTrue(plain.startswith(streamed), f"{stops}: streamed {streamed!r}")
                self.assertEqual(streamed, plain[:min(plain.index(x) for x in stops if x in plain)], stops)
                pieces.append(len([m for m in msgs if m.text]))
            self.assertGreater(max(pieces), 1, f"every call streamed its text in one piece: {pieces}")
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_tokenize_model_info_health_reflection(self):
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
        with Serve() as s, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            tok = stub.Tokenize(pb.TokenizeRequest(text="Once upon a time", add_special_tokens=True))
            self.assertGreater(len(tok.token_ids), 1)
            self.assertEqual(len(tok.tokens), len(tok.token_ids))
            self.assertIn("upon", "".join(tok.tokens))
            # Token ids given directly generate the same as the text.
            by_ids = generate(stub, "", prompt_token_ids=list(tok.token_ids))
            by_text = generate(stub, "Once upon a time")
            self.assertEqual([t for m in by_ids for t in m.token_ids], [t for m in by_text for t in m.token_ids])
            info = stub.ModelInfo(pb.ModelInfoRequest())
            self.assertEqual(info.vocab_size, 512)
            self.assertTrue(info.model.endswith("stories260K.bin"))
            self.assertEqual(info.spec_method, "none")
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5 * time_scale())
            self.assertEqual(health.status, health_pb2.HealthCheckResponse.SERVING)
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            resp = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            names = {sv.name for sv in resp.list_services_response.service}
            self.assertIn("specula.v1.Generation", names)
            self.assertIn("grpc.health.v1.Health", names)

    def wait_kv_free(self, http_base, seconds=5):
        deadline = time.time() + seconds * time_scale()
        while time.time() < deadline:
            m = metrics(http_base)
            if metric(m, "specula:kv_cache_usage_perc") == 0 and metric(m, "specula:num_requests_running") == 0:
                return True
            time.sleep(0.01)
        return False

    def test_cancel_and_deadline_free_the_kv_cache(self):
        # 240 tokens (the context of 256 less the prompt) of the stories15m shape take ~0.5 s: still
        # running when cancelled.
        with Serve(model=random_model(), tokenizer=None) as s, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            req = pb.GenerateRequest(prompt="Once upon a time",
                                     sampling=pb.SamplingParams(ignore_eos=True, max_tokens=240))
            call = stub.Generate(req, timeout=60 * time_scale())
            for _ in range(3):
                next(call)
            self.assertGreater(metric(metrics(s.http_base), "specula:kv_cache_usage_perc"), 0)
            call.cancel()
            self.assertTrue(self.wait_kv_free(s.http_base), "cancelled request still holds KV blocks")
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(req, timeout=0.1))
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            self.assertTrue(self.wait_kv_free(s.http_base), "timed-out request still holds KV blocks")
            # The KV gauge is published before the finished request is counted: wait for the count.
            deadline = time.time() + 10 * time_scale()
            while metric(metrics(s.http_base), "specula:request_success_total", finished_reason="abort") < 2:
                self.assertLess(time.time(), deadline, "the timed-out request was not counted as aborted")
                time.sleep(0.02)
            self.assertEqual(metric(metrics(s.http_base), "specula:request_success_total", finished_reason="abort"), 2)

    def test_every_generation_call_names_the_replica(self):
        """x-specula-replica in the initial metadata of Generate, Tokenize and ModelInfo, answered or
        refused (a bad request, no API key)."""
        key = "sk-replica-grpc"
        auth = [("authorization", f"Bearer {key}")]
        with Serve("--replica-id", "r-test", "--api-key", key, http=False) as s, \
                grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            replica = lambda call: [v for k, v in call.initial_metadata() if k == "x-specula-replica"]
            call = stub.Generate(pb.GenerateRequest(prompt="Once upon a time", sampling=pb.SamplingParams(max_tokens=4)),
                                 metadata=auth, timeout=30 * time_scale())
            self.assertEqual(replica(call), ["r-test"])
            self.assertEqual(sum(len(m.token_ids) for m in call), 4)
            for method, req in ((stub.Tokenize.with_call, pb.TokenizeRequest(text="hi")),
                                (stub.ModelInfo.with_call, pb.ModelInfoRequest())):
                _, call = method(req, metadata=auth, timeout=30 * time_scale())
                self.assertEqual(replica(call), ["r-test"], req)
            refused = [(pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(temperature=-1)), auth,
                        grpc.StatusCode.INVALID_ARGUMENT),
                       (pb.GenerateRequest(prompt="hi"), [], grpc.StatusCode.UNAUTHENTICATED)]
            for req, metadata, code in refused:
                with self.assertRaises(grpc.RpcError) as e:
                    list(stub.Generate(req, metadata=metadata, timeout=30 * time_scale()))
                self.assertEqual(e.exception.code(), code)
                self.assertEqual(replica(e.exception), ["r-test"], code)
            with self.assertRaises(grpc.RpcError) as e:
                stub.ModelInfo.with_call(pb.ModelInfoRequest(), timeout=30 * time_scale())
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(replica(e.exception), ["r-test"])
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_admission_refuses_at_once(self):
        import json
        import urllib.error
        model = random_model()
        with Serve("--max-num-seqs", "1", "--max-queue-len", "1", "--ttft-slo-ms", "1", "--replica-id", "r-busy",
                   model=model, tokenizer=None) as s, grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            long = pb.GenerateRequest(prompt_token_ids=[1, 2, 3], sampling=pb.SamplingParams(max_tokens=200, ignore_eos=True))
            running = stub.Generate(long, timeout=60 * time_scale())
            first = next(running)  # one running: the slot is taken
            queued = stub.Generate(long, timeout=60 * time_scale())
            deadline = time.time() + 10 * time_scale()  # the second waits for the slot: the queue is full
            while metric(metrics(s.http_base), "specula:num_requests_waiting") < 1:
                self.assertLess(time.time(), deadline, "the second request never queued")
                time.sleep(0.01)
            start = time.time()
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(long, timeout=10 * time_scale()))
            self.assertLess(time.time() - start, 0.5 * time_scale())
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("--max-queue-len 1", e.exception.details())
            self.assertIn(("x-specula-replica", "r-busy"), e.exception.initial_metadata())
            req = urllib.request.Request(s.http_base + "/v1/completions", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"prompt": [1, 2], "max_tokens": 4}).encode())
            with self.assertRaises(urllib.error.HTTPError) as h:
                urllib.request.urlopen(req, timeout=10 * time_scale())
            self.assertEqual(h.exception.code, 429)
            self.assertEqual(h.exception.headers["X-Specula-Replica"], "r-busy")
            self.assertEqual(json.loads(h.exception.read())["error"]["type"], "rate_limit_error")
            self.assertEqual(len(first.token_ids) + len([t for m in running for t in m.token_ids]), 200)
            self.assertEqual(len([t for m in queued for t in m.token_ids]), 200)
            # Every TTFT so far is above the 1 ms SLO, but the breaker needs 10 samples in its window.
            short = pb.GenerateRequest(prompt_token_ids=[1, 2, 3], sampling=pb.SamplingParams(max_tokens=2))
            for _ in range(10):
                list(stub.Generate(short, timeout=30 * time_scale()))
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(pb.GenerateRequest(prompt_token_ids=[1, 2, 3], priority=1,
                                                      sampling=pb.SamplingParams(max_tokens=2)), timeout=10 * time_scale()))
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("--ttft-slo-ms 1", e.exception.details())
            # The highest priority (0) is never shed.
            self.assertEqual(sum(len(m.token_ids) for m in stub.Generate(short, timeout=30 * time_scale())), 2)
            m = metrics(s.http_base)
            self.assertEqual(metric(m, "specula:admission_rejected_total", reason="queue_len"), 2)
            self.assertEqual(metric(m, "specula:admission_rejected_total", reason="ttft_slo"), 1)


if __name__ == "__main__":
    unittest.main()
