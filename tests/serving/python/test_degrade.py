"""The degrade path (`specula serve --degrade faq --faq FILE`) against a real server and real openai
and grpcio clients. The TTFT breaker is opened on purpose (--ttft-slo-ms far below any real TTFT, kept
open by priority-0 requests before each test), so that every priority-1 request goes over the limit:
a question in the FAQ file is answered from it, marked as such, and anything else is refused as
before. A bad FAQ file or flag fails at startup, naming the line or the flag."""
import json
import os
import subprocess
import tempfile
import time
import unittest

import grpc
import openai

from serving_util import BINARY, TARGET, TOKENIZER, Serve, metric, metrics, plain_chat_template, stubs, time_scale

FAQ = [
    {"question": "How do I reset my password?", "answer": "Open Settings, then Security, then Reset password."},
    {"question": "What are your opening hours?", "answer": "We are open from 9 to 5, Monday to Friday."},
]
MODEL = TARGET


class DegradeFaqTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        faq = os.path.join(cls.tmp.name, "faq.jsonl")
        with open(faq, "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in FAQ))
        cls.server = Serve("--chat-template", plain_chat_template(cls.tmp.name), "--ttft-slo-ms", "0.001",
                           "--degrade", "faq", "--faq", faq)
        cls.client = openai.OpenAI(base_url=cls.server.http_base + "/v1", api_key="none", max_retries=0,
                                   timeout=30 * time_scale())

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.server.__exit__(None, None, None)
        cls.tmp.cleanup()

    def setUp(self):
        # Ten TTFT samples above the SLO within the breaker's 10 s window open it for priority > 0.
        for _ in range(10):
            self.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=2,
                                           extra_body={"priority": 0})

    def chat(self, question, **kw):
        extra = {"priority": kw.pop("priority", 1)}
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "system", "content": "You help customers."},
                                   {"role": "user", "content": question}], extra_body=extra, **kw)
        return raw.headers, raw.parse()

    def test_chat_question_answered_from_the_faq_once_normalized(self):
        headers, r = self.chat("  HOW do I reset   my ｐａｓｓｗｏｒｄ？ ")
        self.assertEqual(headers["x-specula-answered-by"], "faq")
        self.assertEqual(r.model_extra.get("answered_by"), "faq")
        self.assertEqual(r.choices[0].message.content, FAQ[0]["answer"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertGreater(r.usage.prompt_tokens, 5)
        self.assertGreater(r.usage.completion_tokens, 5)

    def test_other_questions_and_unanswerable_requests_are_refused(self):
        before = metrics(self.server.http_base)
        with self.assertRaises(openai.RateLimitError):
            self.chat("How do I close my account?")
        with self.assertRaises(openai.RateLimitError):  # no logprobs to give
            self.chat(FAQ[0]["question"], logprobs=True)
        with self.assertRaises(openai.RateLimitError):  # no grammar to follow
            self.chat(FAQ[0]["question"], response_format={"type": "json_object"})
        headers, _ = self.chat(FAQ[1]["question"])
        self.assertEqual(headers["x-specula-answered-by"], "faq")
        after = metrics(self.server.http_base)
        grew = {path: metric(after, "specula:admission_degraded_total", reason="ttft_slo", path=path) -
                metric(before, "specula:admission_degraded_total", reason="ttft_slo", path=path)
                for path in ("refuse", "faq")}
        self.assertEqual(grew, {"refuse": 3, "faq": 1})
        self.assertEqual(metric(after, "specula:faq_answer_seconds_count") -
                         metric(before, "specula:faq_answer_seconds_count"), 1)
        self.assertEqual(metric(after, "specula:admission_rejected_total", reason="ttft_slo") -
                         metric(before, "specula:admission_rejected_total", reason="ttft_slo"), 3)

    def test_priority_zero_is_answered_by_the_model(self):
        headers, r = self.chat(FAQ[0]["question"], priority=0, max_tokens=4)
        self.assertEqual(headers["x-specula-answered-by"], "model")
        self.assertNotIn("answered_by", r.model_extra)
        self.assertNotEqual(r.choices[0].message.content, FAQ[0]["answer"])

    def test_completion_streamed_and_samples(self):
        raw = self.client.completions.with_raw_response.create(
            model=MODEL, prompt="what are your opening hours", stream=True, n=2, max_tokens=64,
            stream_options={"include_usage": True}, extra_body={"priority": 1})
        self.assertEqual(raw.headers["x-specula-answered-by"], "faq")
        texts, finish = {0: "", 1: ""}, {}
        usage = None
        for chunk in raw.parse():
            self.assertEqual(chunk.model_extra.get("answered_by"), "faq")
            for c in chunk.choices:
                texts[c.index] += c.text
                finish[c.index] = c.finish_reason
            usage = chunk.usage or usage
        self.assertEqual(texts, {0: FAQ[1]["answer"], 1: FAQ[1]["answer"]})
        self.assertEqual(finish, {0: "stop", 1: "stop"})
        self.assertEqual(usage.completion_tokens % 2, 0)

    def test_max_tokens_and_stop_cut_the_answer(self):
        _, r = self.chat(FAQ[0]["question"], max_tokens=2)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 2)
        self.assertTrue(FAQ[0]["answer"].startswith(r.choices[0].message.content))
        _, r = self.chat(FAQ[0]["question"], stop=[", then Reset"])
        self.assertEqual(r.choices[0].message.content, "Open Settings, then Security")
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_grpc(self):
        pb, pb_grpc = stubs()
        with grpc.insecure_channel(self.server.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            call = stub.Generate(pb.GenerateRequest(prompt="How do I reset my password", priority=1,
                                                    sampling=pb.SamplingParams(max_tokens=64)), timeout=30)
            last = list(call)[-1]
            self.assertEqual(dict(call.initial_metadata())["x-specula-answered-by"], "faq")
            self.assertEqual(last.answered_by, "faq")
            self.assertEqual(last.text, FAQ[0]["answer"])
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(pb.GenerateRequest(prompt="Tell me a story", priority=1), timeout=30))
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            model = list(stub.Generate(pb.GenerateRequest(prompt="Tell me a story", priority=0,
                                                          sampling=pb.SamplingParams(max_tokens=4)), timeout=30))
            self.assertEqual(model[-1].answered_by, "model")


class DegradeFlagsTest(unittest.TestCase):
    def start(self, *flags):
        t0 = time.time()
        p = subprocess.run([BINARY, "serve", "--model", TARGET, "--tokenizer", TOKENIZER, "--grpc-port", "0",
                            "--http-port", "0", *flags], capture_output=True, text=True, timeout=60 * time_scale())
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertLess(time.time() - t0, 10 * time_scale())
        return p.stderr

    def test_bad_files_and_flags_fail_at_startup(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.jsonl")
            with open(bad, "w") as f:
                f.write(json.dumps(FAQ[0]) + "\n" + '{"question": "Hours?", "answer": 5}\n')
            dup = os.path.join(d, "dup.jsonl")
            with open(dup, "w") as f:
                f.write(json.dumps(FAQ[0]) + "\n" + json.dumps({"question": "HOW do I reset my password",
                                                                "answer": "x"}) + "\n")
            self.assertIn(f"--faq: {bad}:2: 'answer' must be a non-empty string", self.start("--degrade", "faq", "--faq", bad))
            self.assertIn(f"--faq: {dup}:2: the question", self.start("--degrade", "faq", "--faq", dup))
            self.assertIn("--faq: cannot open", self.start("--degrade", "faq", "--faq", os.path.join(d, "none")))
            self.assertIn("--degrade faq: needs --faq FILE", self.start("--degrade", "faq"))
            self.assertIn("--faq: needs --degrade faq", self.start("--faq", bad))
            self.assertIn("--degrade draft: not offered", self.start("--degrade", "draft"))
            self.assertIn("--degrade: 'fast' is not refuse or faq", self.start("--degrade", "fast"))


if __name__ == "__main__":
    unittest.main()
