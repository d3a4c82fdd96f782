"""Per-request speculative-decoding metrics against a real `specula serve` (the TinyStories target
with its draft, k = 3), read with the official `openai` client and grpcio:

- completions and chat, streamed and not, n = 1 and n = 2: `metrics.speculative_decoding` where vLLM
  puts it (the root for one choice, the usage chunk when streamed; null at the root for n > 1, where
  each choice carries its own, streamed on its last chunk), and gRPC's `speculative_decoding` on each
  sample's last message;
- each object is consistent: the histogram has k + 1 buckets adding up to num_spec_steps, accepted
  <= draft tokens, the rates and per-position counts match the counts;
- over requests that all complete, the objects add up exactly to the server's Prometheus
  spec-decode counters (drafts, draft tokens, accepted tokens, accepted per position);
- a request that drafted nothing has an all-zero object; a server without speculation, or with
  `--per-request-spec-decode-metrics none`, answers without them; `specula generate --json` and
  --prompts-file lines carry the same object.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import grpc
import openai

sys.path.insert(0, os.path.dirname(__file__))
from serving_util import (BINARY, DRAFT, PROMPTS, TARGET, TOKENIZER, Serve, generate_batch, metric,  # noqa: E402
                          metrics, stubs, time_scale)

pb, pb_grpc = stubs()
K = 3
SPEC = ("--spec-method", "draft", "--draft-model", DRAFT, "--num-spec-tokens", str(K))
VLLM_FIELDS = {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
               "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens"}
MAX_TOKENS = 16
MESSAGES = [{"role": "user", "content": "Once upon a time there was a little dog"}]


def chat_template_file():
    """The TinyStories model has no chat template: one that writes the messages' text."""
    path = os.path.join(tempfile.mkdtemp(prefix="specula_spec_metrics_"), "plain.jinja")
    with open(path, "w") as f:
        f.write("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return path


def from_proto(sd):
    """gRPC's SpeculativeDecoding as the JSON object's dict."""
    return {"mean_acceptance_length": sd.mean_acceptance_length, "draft_acceptance_rate": sd.draft_acceptance_rate,
            "acceptance_histogram": list(sd.acceptance_histogram), "num_spec_steps": sd.num_spec_steps,
            "num_accepted_draft_tokens": sd.num_accepted_draft_tokens, "num_draft_tokens": sd.num_draft_tokens,
            "num_spec_tokens": sd.num_spec_tokens, "accepted_per_position": list(sd.accepted_per_position),
            "reached_per_position": list(sd.reached_per_position)}


SPEC_COUNTERS = ("specula:spec_decode_num_drafts_total", "specula:spec_decode_num_draft_tokens_total",
                 "specula:spec_decode_num_accepted_tokens_total")


def spec_counters(http_base):
    """The spec-decode counters: (drafts, draft tokens, accepted tokens, [accepted at position i])."""
    m = metrics(http_base)
    per_pos = [metric(m, "specula:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(K)]
    return tuple(metric(m, name) for name in SPEC_COUNTERS) + (per_pos,)


class Checks:
    def check(self, sd, what):
        """One object's consistency; returns it."""
        self.assertIsInstance(sd, dict, what)
        self.assertTrue(VLLM_FIELDS <= set(sd), (what, sd))
        self.assertEqual(sd["num_spec_tokens"], K, what)
        hist, steps = sd["acceptance_histogram"], sd["num_spec_steps"]
        accepted, drafted = sd["num_accepted_draft_tokens"], sd["num_draft_tokens"]
        self.assertEqual(len(hist), K + 1, what)
        self.assertEqual(sum(hist), steps, what)
        self.assertEqual(sum(j * n for j, n in enumerate(hist)), accepted, what)
        self.assertLessEqual(accepted, drafted, what)
        self.assertLessEqual(drafted, K * steps, what)
        self.assertGreaterEqual(drafted, steps, what)  # a verification step carries at least one draft
        self.assertAlmostEqual(sd["draft_acceptance_rate"], accepted / drafted if drafted else 0.0, places=12, msg=what)
        self.assertAlmostEqual(sd["mean_acceptance_length"], 1 + accepted / steps if steps else 1.0, places=12,
                               msg=what)
        acc, reached = sd["accepted_per_position"], sd["reached_per_position"]
        self.assertEqual((len(acc), len(reached)), (K, K), what)
        self.assertEqual(sum(acc), accepted, what)
        self.assertEqual(reached[0], steps, what)  # every step verifies its first draft
        for i in range(K):
            self.assertLessEqual(acc[i], reached[i], what)
            if i + 1 < K:
                self.assertLessEqual(reached[i + 1], acc[i], what)  # draft i + 1 is reached past an accepted i
        return sd


class SpeculatingServerTest(Checks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.serve = Serve(*SPEC, "--chat-template", chat_template_file())
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0,
                                   timeout=60 * time_scale())
        cls.model = cls.client.models.list().data[0].id
        cls.channel = grpc.insecure_channel(cls.serve.grpc_target)
        cls.stub = pb_grpc.GenerationStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def args(self, n, seed):
        return dict(model=self.model, max_tokens=MAX_TOKENS, n=n, temperature=1.0 if n > 1 else 0.0, seed=seed,
                    extra_body={"ignore_eos": True})

    def completion(self, prompt, n, stream, seed=1):
        """Each choice's object, checked for where it sits."""
        kw = self.args(n, seed)
        if not stream:
            body = self.client.completions.create(prompt=prompt, **kw).model_dump()
            return self.placed(body, body["choices"], n, "completion")
        chunks = [c.model_dump() for c in self.client.completions.create(
            prompt=prompt, stream=True, stream_options={"include_usage": True}, **kw)]
        return self.placed_stream(chunks, n, "streamed completion")

    def chat(self, n, stream, seed=1):
        kw = self.args(n, seed)
        if not stream:
            body = self.client.chat.completions.create(messages=MESSAGES, **kw).model_dump()
            return self.placed(body, body["choices"], n, "chat")
        chunks = [c.model_dump() for c in self.client.chat.completions.create(
            messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **kw)]
        return self.placed_stream(chunks, n, "streamed chat")

    def placed(self, body, choices, n, what):
        self.assertEqual(len(choices), n, what)
        if n == 1:
            self.assertIsNone(choices[0].get("metrics"), what)
            return [self.check(body["metrics"]["speculative_decoding"], what)]
        self.assertIn("speculative_decoding", body["metrics"], what)
        self.assertIsNone(body["metrics"]["speculative_decoding"], what)  # vLLM's null for n > 1
        return [self.check(c["metrics"]["speculative_decoding"], f"{what} choice {c['index']}") for c in choices]

    def placed_stream(self, chunks, n, what):
        usage = chunks[-1]
        self.assertEqual(usage["choices"], [], what)
        self.assertIsNotNone(usage["usage"], what)
        per_choice = {}
        for c in chunks[:-1]:
            self.assertIsNone(c.get("metrics"), what)  # only the usage chunk carries the root's
            for ch in c["choices"]:
                if ch.get("metrics") is not None:
                    self.assertIsNotNone(ch["finish_reason"], what)  # a choice's own rides its last chunk
                    per_choice[ch["index"]] = ch["metrics"]["speculative_decoding"]
        if n == 1:
            self.assertEqual(per_choice, {}, what)
            return [self.check(usage["metrics"]["speculative_decoding"], what)]
        self.assertIsNone(usage["metrics"]["speculative_decoding"], what)
        self.assertEqual(sorted(per_choice), list(range(n)), what)
        return [self.check(per_choice[i], f"{what} choice {i}") for i in range(n)]

    def grpc_objects(self, prompt, n):
        req = pb.GenerateRequest(prompt=prompt, sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                                           n=n, temperature=1.0, seed=3))
        out = {}
        for msg in self.stub.Generate(req, timeout=60 * time_scale()):
            if msg.finish_reason:
                self.assertTrue(msg.HasField("speculative_decoding"))
                sd = self.check(from_proto(msg.speculative_decoding), f"gRPC sample {msg.index}")
                # The older SpecStats message says the same.
                self.assertEqual((msg.spec.num_drafts, msg.spec.num_draft_tokens, msg.spec.num_accepted_tokens),
                                 (sd["num_spec_steps"], sd["num_draft_tokens"], sd["num_accepted_draft_tokens"]))
                out[msg.index] = sd
            else:
                self.assertFalse(msg.HasField("speculative_decoding"))
        self.assertEqual(sorted(out), list(range(n)))
        return list(out.values())

    def test_every_surface_adds_up_to_the_prometheus_counters(self):
        before = spec_counters(self.serve.http_base)
        objects = []
        objects += self.completion(PROMPTS[0], 1, stream=False)
        objects += self.completion(PROMPTS[1], 1, stream=True)
        objects += self.completion(PROMPTS[2], 2, stream=False)
        objects += self.completion(PROMPTS[3], 2, stream=True)
        objects += self.chat(1, stream=False)
        objects += self.chat(1, stream=True)
        objects += self.chat(2, stream=False, seed=5)
        objects += self.chat(2, stream=True, seed=7)
        objects += self.grpc_objects(PROMPTS[4], 1)
        objects += self.grpc_objects(PROMPTS[5], 2)
        self.assertEqual(len(objects), 15)  # 6 completions, 6 chat, 3 gRPC samples
        after = spec_counters(self.serve.http_base)
        got = (sum(o["num_spec_steps"] for o in objects), sum(o["num_draft_tokens"] for o in objects),
               sum(o["num_accepted_draft_tokens"] for o in objects))
        self.assertEqual(got, tuple(a - b for a, b in zip(after[:3], before[:3])))
        per_pos = [sum(o["accepted_per_position"][i] for o in objects) for i in range(K)]
        self.assertEqual(per_pos, [a - b for a, b in zip(after[3], before[3])])
        self.assertGreater(got[0], 0)  # the draft drafted: the sums are not all zeros
        self.assertGreater(got[2], 0)

    def test_greedy_is_the_same_whichever_surface(self):
        # Greedy decoding verifies the same drafts, so one prompt's object is the same on each surface.
        body = self.client.completions.create(prompt=PROMPTS[6], **self.args(1, 1)).model_dump()
        req = pb.GenerateRequest(prompt=PROMPTS[6], sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        last = list(self.stub.Generate(req, timeout=60 * time_scale()))[-1]
        self.assertEqual(self.check(body["metrics"]["speculative_decoding"], "HTTP"),
                         self.check(from_proto(last.speculative_decoding), "gRPC"))

    def test_a_request_that_never_drafted_has_zeros(self):
        # One token comes from the prefill: no verification step.
        body = self.client.completions.create(model=self.model, prompt=PROMPTS[7], max_tokens=1).model_dump()
        sd = self.check(body["metrics"]["speculative_decoding"], "max_tokens 1")
        self.assertEqual(sd["acceptance_histogram"], [0] * (K + 1))
        self.assertEqual((sd["num_spec_steps"], sd["num_draft_tokens"], sd["mean_acceptance_length"]), (0, 0, 1.0))

    def test_streamed_without_usage_carries_none(self):
        # As vLLM: one choice's object rides the usage chunk, which the client did not ask for.
        chunks = [c.model_dump() for c in self.client.completions.create(
            prompt=PROMPTS[8], stream=True, **self.args(1, 1))]
        self.assertTrue(chunks)
        for c in chunks:
            self.assertIsNone(c.get("metrics"))
            for ch in c["choices"]:
                self.assertIsNone(ch.get("metrics"))


class WithoutMetricsTest(unittest.TestCase):
    """A server without speculation, and one with the metrics turned off: the responses as before."""

    def expect_none(self, serve, with_spec):
        client = openai.OpenAI(base_url=serve.http_base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        for n in (1, 2):
            body = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=8, n=n, seed=1).model_dump()
            self.assertNotIn("metrics", body)
            self.assertTrue(all(c.get("metrics") is None for c in body["choices"]))
            chunks = [c.model_dump() for c in client.completions.create(
                model=model, prompt=PROMPTS[0], max_tokens=8, n=n, seed=1, stream=True,
                stream_options={"include_usage": True})]
            self.assertIsNotNone(chunks[-1]["usage"])
            for c in chunks:
                self.assertIsNone(c.get("metrics"))
                self.assertTrue(all(ch.get("metrics") is None for ch in c["choices"]))
        with grpc.insecure_channel(serve.grpc_target) as ch:
            req = pb.GenerateRequest(prompt=PROMPTS[0], sampling=pb.SamplingParams(max_tokens=8, ignore_eos=True))
            last = list(pb_grpc.GenerationStub(ch).Generate(req, timeout=60 * time_scale()))[-1]
        self.assertFalse(last.HasField("speculative_decoding"))
        self.assertEqual(last.spec.num_drafts > 0, with_spec)  # the older SpecStats message stays
        self.assertEqual(serve.stop(), 0, serve.stderr())

    def test_no_speculation(self):
        with Serve() as s:
            self.expect_none(s, with_spec=False)

    def test_turned_off(self):
        with Serve(*SPEC, "--per-request-spec-decode-metrics", "none") as s:
            self.expect_none(s, with_spec=True)


class GenerateJsonTest(Checks, unittest.TestCase):
    """`specula generate --json` and --prompts-file lines: the same object, when speculating."""

    def test_single_prompt(self):
        out = subprocess.run([BINARY, "generate", "--model", TARGET, "--tokenizer", TOKENIZER, "--prompt", PROMPTS[0],
                              "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", *SPEC],
                             capture_output=True, text=True, check=True).stdout
        j = json.loads(out)
        sd = self.check(j["metrics"]["speculative_decoding"], "generate --json")
        self.assertGreater(sd["num_spec_steps"], 0)
        self.assertEqual((j["spec"]["drafts"], j["spec"]["draft_tokens"], j["spec"]["accepted_tokens"]),
                         (sd["num_spec_steps"], sd["num_draft_tokens"], sd["num_accepted_draft_tokens"]))

    def test_prompts_file(self):
        lines = generate_batch(PROMPTS[:3], MAX_TOKENS, "--ignore-eos", *SPEC)
        self.assertEqual(len(lines), 3)
        for i, j in lines.items():
            self.check(j["metrics"]["speculative_decoding"], f"line {i}")
        plain = generate_batch(PROMPTS[:1], MAX_TOKENS)
        self.assertNotIn("metrics", plain[0])


if __name__ == "__main__":
    unittest.main()
