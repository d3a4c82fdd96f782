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
  --prompts-file lines carry the same object;
- structured output's drafts: a constrained request shows the drafts its grammar forced (with a
  proposer, and without one, where only such a request has the object) and the proposer's drafts
  the grammar cut (n-grams), and these add up to the Prometheus counters too.
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
GRAMMAR_FIELDS = ("num_forced_draft_tokens", "num_accepted_forced_tokens", "num_grammar_cut_tokens")
# Keys the grammar forces, values the model chooses: a short output that ends by its grammar.
SCHEMA = {"type": "object", "properties": {"mood": {"type": "string", "enum": ["happy", "sad", "sleepy"]},
                                           "age": {"type": "integer", "minimum": 1, "maximum": 99}},
          "required": ["mood", "age"]}
CONSTRAINED_PROMPT = "Once upon a time, there was a little"
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
            "reached_per_position": list(sd.reached_per_position),
            **{f: getattr(sd, f) for f in GRAMMAR_FIELDS}}


# The object's field each counter adds up.
COUNTED = {"specula:spec_decode_num_drafts_total": "num_spec_steps",
           "specula:spec_decode_num_draft_tokens_total": "num_draft_tokens",
           "specula:spec_decode_num_accepted_tokens_total": "num_accepted_draft_tokens",
           "specula:spec_decode_num_forced_draft_tokens_total": "num_forced_draft_tokens",
           "specula:spec_decode_num_accepted_forced_tokens_total": "num_accepted_forced_tokens",
           "specula:spec_decode_num_grammar_cut_tokens_total": "num_grammar_cut_tokens"}


def counted(http_base, positions):
    """Every spec-decode counter by the object's field it adds up, and the accepted per position."""
    m = metrics(http_base)
    out = {field: metric(m, name) for name, field in COUNTED.items()}
    out["accepted_per_position"] = [metric(m, "specula:spec_decode_num_accepted_tokens_per_pos_total",
                                           position=str(i)) for i in range(positions)]
    return out


def summed(objects, positions):
    """The objects added up as `counted` reads the counters."""
    out = {field: sum(o[field] for o in objects) for field in COUNTED.values()}
    out["accepted_per_position"] = [sum(o["accepted_per_position"][i] for o in objects
                                        if i < len(o["accepted_per_position"])) for i in range(positions)]
    return out


def constrained_http(client, model, stream, seed=1):
    """One greedy constrained completion's `speculative_decoding` (None where it has none) and its text."""
    kw = dict(model=model, prompt=CONSTRAINED_PROMPT, max_tokens=64, temperature=0.0, seed=seed,
              extra_body={"json_schema": SCHEMA})
    if not stream:
        body = client.completions.create(**kw).model_dump()
        return (body.get("metrics") or {}).get("speculative_decoding"), body["choices"][0]["text"]
    chunks = [c.model_dump() for c in client.completions.create(stream=True, stream_options={"include_usage": True},
                                                                 **kw)]
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    return (chunks[-1].get("metrics") or {}).get("speculative_decoding"), text


def constrained_grpc(stub):
    """One constrained gRPC sample's last message."""
    req = pb.GenerateRequest(prompt=CONSTRAINED_PROMPT, sampling=pb.SamplingParams(max_tokens=64),
                             constraint=pb.Constraint(json_schema=json.dumps(SCHEMA)))
    return list(stub.Generate(req, timeout=60 * time_scale()))[-1]


class Checks:
    def check(self, sd, what, k=K, constrained=False):
        """One object's consistency; returns it. A constrained request's grammar may force more than k
        drafts in a step, so its histogram may be longer than k + 1."""
        self.assertIsInstance(sd, dict, what)
        self.assertTrue(VLLM_FIELDS <= set(sd), (what, sd))
        self.assertTrue(set(GRAMMAR_FIELDS) <= set(sd), (what, sd))
        self.assertEqual(sd["num_spec_tokens"], k, what)
        hist, steps = sd["acceptance_histogram"], sd["num_spec_steps"]
        accepted, drafted = sd["num_accepted_draft_tokens"], sd["num_draft_tokens"]
        width = len(hist) - 1  # the longest draft the object has room for
        if constrained:
            self.assertGreaterEqual(width, k, what)
        else:
            self.assertEqual(width, k, what)
        self.assertEqual(sum(hist), steps, what)
        self.assertEqual(sum(j * n for j, n in enumerate(hist)), accepted, what)
        self.assertLessEqual(accepted, drafted, what)
        self.assertLessEqual(drafted, width * steps, what)
        self.assertGreaterEqual(drafted, steps, what)  # a verification step carries at least one draft
        self.assertAlmostEqual(sd["draft_acceptance_rate"], accepted / drafted if drafted else 0.0, places=12, msg=what)
        self.assertAlmostEqual(sd["mean_acceptance_length"], 1 + accepted / steps if steps else 1.0, places=12,
                               msg=what)
        acc, reached = sd["accepted_per_position"], sd["reached_per_position"]
        self.assertEqual((len(acc), len(reached)), (width, width), what)
        self.assertEqual(sum(acc), accepted, what)
        if width:
            self.assertEqual(reached[0], steps, what)  # every step verifies its first draft
        for i in range(width):
            self.assertLessEqual(acc[i], reached[i], what)
            if i + 1 < width:
                self.assertLessEqual(reached[i + 1], acc[i], what)  # draft i + 1 is reached past an accepted i
        forced, forced_accepted, cut = (sd[f] for f in GRAMMAR_FIELDS)
        self.assertLessEqual(forced, drafted, what)  # forced drafts are drafts too
        self.assertLessEqual(forced_accepted, min(forced, accepted), what)
        self.assertGreaterEqual(cut, 0, what)
        if not constrained:
            self.assertEqual((forced, forced_accepted, cut), (0, 0, 0), what)
        if k == 0:  # no proposer: every draft is the grammar's, and nothing proposed to cut
            self.assertEqual((forced, cut), (drafted, 0), what)
        return sd

    def assert_adds_up(self, objects, before, after, positions):
        """The objects add up exactly to the counters' growth from `before` to `after` (counted)."""
        grown = {f: after[f] - before[f] for f in COUNTED.values()}
        grown["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"],
                                                                before["accepted_per_position"])]
        self.assertEqual(summed(objects, positions), grown)


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
        before = counted(self.serve.http_base, K)
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
        # Unconstrained: the grammar's counters stay as they were, as each object's zeros say.
        self.assert_adds_up(objects, before, counted(self.serve.http_base, K), K)
        got = summed(objects, K)
        self.assertGreater(got["num_spec_steps"], 0)  # the draft drafted: the sums are not all zeros
        self.assertGreater(got["num_accepted_draft_tokens"], 0)

    def test_constrained_requests_draft_under_the_grammar(self):
        # The draft model drafts under the grammar (its rows masked) every step, so the grammar's forced
        # drafts, which fill the steps where the proposer has none, never come.
        positions = K
        before = counted(self.serve.http_base, positions)
        objects = []
        for stream in (False, True):
            sd, text = constrained_http(self.client, self.model, stream)
            self.assertEqual(list(json.loads(text)), ["mood", "age"], text)
            objects.append(self.check(sd, f"constrained, streamed: {stream}", constrained=True))
        last = constrained_grpc(self.stub)
        self.assertTrue(last.HasField("speculative_decoding"))
        objects.append(self.check(from_proto(last.speculative_decoding), "constrained gRPC", constrained=True))
        for sd in objects:
            self.assertEqual(sd["num_forced_draft_tokens"], 0, sd)
            self.assertGreater(sd["num_accepted_draft_tokens"], 0, sd)
        self.assertEqual(objects[0], objects[1])  # greedy: the same drafts streamed or not
        self.assert_adds_up(objects, before, counted(self.serve.http_base, positions), positions)

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


class ExpectNone:
    def expect_none(self, serve, with_spec):
        """Unconstrained requests on every surface answer without the object."""
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


class NoProposerTest(Checks, ExpectNone, unittest.TestCase):
    """A server without a proposer: a request without drafts answers as without speculation; a
    constrained one, whose grammar forces drafts (--grammar-drafts' default 8), with its object (k = 0)."""

    @classmethod
    def setUpClass(cls):
        cls.serve = Serve()
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0,
                                   timeout=60 * time_scale())
        cls.model = cls.client.models.list().data[0].id
        cls.channel = grpc.insecure_channel(cls.serve.grpc_target)
        cls.stub = pb_grpc.GenerationStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def test_without_drafts_none(self):
        self.expect_none(self.serve, with_spec=False)

    def test_forced_drafts_show_theirs(self):
        positions = 8
        before = counted(self.serve.http_base, positions)
        objects = []
        for stream in (False, True):
            sd, text = constrained_http(self.client, self.model, stream)
            self.assertEqual(list(json.loads(text)), ["mood", "age"], text)
            objects.append(self.check(sd, f"no proposer, streamed: {stream}", k=0, constrained=True))
        last = constrained_grpc(self.stub)
        self.assertTrue(last.HasField("speculative_decoding"))
        objects.append(self.check(from_proto(last.speculative_decoding), "no proposer, gRPC", k=0, constrained=True))
        self.assertEqual(last.spec.num_draft_tokens, objects[-1]["num_draft_tokens"])
        for sd in objects:
            self.assertGreater(sd["num_forced_draft_tokens"], 0, sd)
        # Not the same object twice: a greedy request's forced drafts follow how the model spelled the
        # same keys in earlier requests (the engine learns it), while its text is the same.
        after = counted(self.serve.http_base, positions)
        self.assert_adds_up(objects, before, after, positions)
        self.assertGreater(after["num_draft_tokens"], before["num_draft_tokens"])  # the drafts on /metrics


class GrammarCutTest(Checks, unittest.TestCase):
    """n-grams draft from the text whatever the grammar allows: a constrained request's grammar cuts
    the drafts that leave it (greedy, so the same every run)."""

    def test_cut_drafts_are_counted(self):
        with Serve("--spec-method", "ngram", "--num-spec-tokens", str(K)) as serve:
            client = openai.OpenAI(base_url=serve.http_base + "/v1", api_key="unused", max_retries=0,
                                   timeout=60 * time_scale())
            model = client.models.list().data[0].id
            positions = K + 8
            before = counted(serve.http_base, positions)
            sd, text = constrained_http(client, model, stream=False)
            self.assertEqual(list(json.loads(text)), ["mood", "age"], text)
            objects = [self.check(sd, "n-grams", constrained=True)]
            with grpc.insecure_channel(serve.grpc_target) as ch:
                last = constrained_grpc(pb_grpc.GenerationStub(ch))
            objects.append(self.check(from_proto(last.speculative_decoding), "n-grams, gRPC", constrained=True))
            for o in objects:
                self.assertGreater(o["num_grammar_cut_tokens"], 0, o)
                self.assertGreater(o["num_forced_draft_tokens"], 0, o)
            after = counted(serve.http_base, positions)
            self.assert_adds_up(objects, before, after, positions)
            self.assertEqual(serve.stop(), 0, serve.stderr())


class WithoutMetricsTest(ExpectNone, unittest.TestCase):
    """A server with the metrics turned off: the responses as before."""

    def test_turned_off(self):
        with Serve(*SPEC, "--per-request-spec-decode-metrics", "none") as s:
            self.expect_none(s, with_spec=True)
            self.assertEqual(s.stop(), 0, s.stderr())


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

    def test_constrained_line_without_a_proposer(self):
        # The grammar's forced drafts give a line the object without a proposer; a plain line has none.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "prompts.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"id": 0, "prompt": CONSTRAINED_PROMPT, "json_schema": SCHEMA, "max_tokens": 64}) +
                        "\n")
                f.write(json.dumps({"id": 1, "prompt": PROMPTS[0], "max_tokens": 8}) + "\n")
            out = subprocess.run([BINARY, "generate", "--model", TARGET, "--tokenizer", TOKENIZER, "--prompts-file",
                                  path, "--no-progress"], capture_output=True, text=True, check=True).stdout
        lines = {j["id"]: j for j in map(json.loads, filter(str.strip, out.splitlines()))}
        sd = self.check(lines[0]["metrics"]["speculative_decoding"], "constrained line", k=0, constrained=True)
        self.assertGreater(sd["num_forced_draft_tokens"], 0)
        self.assertNotIn("metrics", lines[1])


if __name__ == "__main__":
    unittest.main()
