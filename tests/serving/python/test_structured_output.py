"""Structured output end to end on TinyStories, whose 512-token vocabulary and 260K parameters know
nothing of JSON: whatever the model prefers, the mask must make every output follow its constraint.
The constraints are bounded (enums, ranged integers, fixed-length regexes, choices), so every output
ends by its grammar, and each is checked by an independent checker (jsonschema, re.fullmatch).

Surfaces: the official `openai` client over HTTP (response_format, vLLM's structured_outputs and
guided_*, llama.cpp's json_schema and grammar; streamed and not; n > 1), gRPC's `constraint`, and a
`specula generate --prompts-file` line; a server with speculation (greedy: the plain server's output).
Refusals: two sources at once, keywords the grammar engine would ignore, a grammar that does not parse.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import grpc
import jsonschema
import openai

from serving_util import BINARY, SOURCE, TARGET, TOKENIZER, Serve, stubs, time_scale

sys.path.insert(0, os.path.join(SOURCE, "bench"))
from structured_refusals import bad_cases  # noqa: E402  (the benchmark's set, timed there)

PROMPT = "Once upon a time, there was a little"
SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"type": "string", "enum": ["happy", "sad", "sleepy"]},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["cat", "dog"]}, "minItems": 1, "maxItems": 3},
        "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer",
                "minimum": 0, "maximum": 4}}, "required": ["kind", "legs"]},
    },
    "required": ["mood", "age", "tags", "pet"],
}
PHONE = r"[0-9]{3}-[0-9]{4}"
GRAMMAR = 'root ::= "The " animal " is " colour "."\nanimal ::= "cat" | "dog" | "bird"\ncolour ::= "red" | "blue"\n'
GRAMMAR_RE = r"The (cat|dog|bird) is (red|blue)\."


class StructuredOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.serve = Serve()
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0,
                                   timeout=60 * time_scale())
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def complete(self, extra, **kw):
        kw.setdefault("max_tokens", 200)
        return self.client.completions.create(model=self.model, prompt=PROMPT, extra_body=extra, **kw)

    def check_json(self, text, schema=SCHEMA):
        jsonschema.validate(json.loads(text), schema)

    def test_json_schema_each_field(self):
        for extra in ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA,
                                                                                  "strict": True}}},
                      {"structured_outputs": {"json": SCHEMA}}, {"guided_json": json.dumps(SCHEMA)},
                      {"json_schema": SCHEMA}):
            for temperature in (0, 1):
                c = self.complete(extra, temperature=temperature, seed=7).choices[0]
                self.assertEqual(c.finish_reason, "stop", (extra, c.text))
                self.check_json(c.text)
        # Properties come in the order the schema gives them.
        text = self.complete({"json_schema": SCHEMA}, temperature=0).choices[0].text
        keys = list(json.loads(text))
        self.assertEqual(keys, ["mood", "age", "tags", "pet"], text)

    def test_json_object(self):
        c = self.complete({"response_format": {"type": "json_object"}}, max_tokens=64, temperature=0).choices[0]
        if c.finish_reason == "stop":
            self.assertIsInstance(json.loads(c.text), dict)
        else:  # cut by max_tokens: still a prefix of an object
            self.assertTrue(c.text.lstrip().startswith("{"), c.text)

    def test_regex_choice_grammar(self):
        for extra in ({"guided_regex": PHONE}, {"structured_outputs": {"regex": PHONE}}):
            c = self.complete(extra, temperature=1, seed=3).choices[0]
            self.assertRegex(c.text, "^" + PHONE + "$")
            self.assertEqual(c.finish_reason, "stop")
        for extra in ({"guided_choice": ["yes", "no", "maybe later"]},
                      {"structured_outputs": {"choice": ["yes", "no", "maybe later"]}}):
            c = self.complete(extra, temperature=1, seed=5).choices[0]
            self.assertIn(c.text, ["yes", "no", "maybe later"])
        for extra in ({"guided_grammar": GRAMMAR}, {"structured_outputs": {"grammar": GRAMMAR}}, {"grammar": GRAMMAR}):
            c = self.complete(extra, temperature=1, seed=11).choices[0]
            self.assertIsNotNone(re.fullmatch(GRAMMAR_RE, c.text), c.text)

    def test_samples_and_streams(self):
        # n > 1: each sample has its own matcher, so each is valid on its own.
        r = self.complete({"json_schema": SCHEMA}, n=3, temperature=1, seed=1)
        self.assertEqual(len(r.choices), 3)
        for c in r.choices:
            self.check_json(c.text)
        texts = {c.text for c in r.choices}
        self.assertGreater(len(texts), 1, texts)
        # Streamed: the deltas add up to a valid document.
        stream = self.complete({"json_schema": SCHEMA}, temperature=1, seed=2, stream=True)
        text, finish = "", None
        for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        self.check_json(text)
        self.assertEqual(finish, "stop")

    def test_stop_string_beside_a_grammar(self):
        grammar = 'root ::= "red fox then blue jay"'
        c = self.complete({"guided_grammar": grammar}, stop=["blue"], temperature=0).choices[0]
        self.assertEqual(c.text, "red fox then ")
        self.assertEqual(c.finish_reason, "stop")

    def test_grpc_constraint(self):
        pb, pb_grpc = stubs()
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(self.serve.grpc_target))
        req = pb.GenerateRequest(prompt=PROMPT, sampling=pb.SamplingParams(max_tokens=400, temperature=1),
                                 constraint=pb.Constraint(json_schema=json.dumps(SCHEMA)))
        msgs = list(stub.Generate(req, timeout=60 * time_scale()))
        self.check_json("".join(m.text for m in msgs))
        req = pb.GenerateRequest(prompt=PROMPT, sampling=pb.SamplingParams(max_tokens=10),
                                 constraint=pb.Constraint(choice=pb.Choices(values=["left", "right"])))
        self.assertIn("".join(m.text for m in stub.Generate(req, timeout=60 * time_scale())), ["left", "right"])
        bad = pb.GenerateRequest(prompt=PROMPT, constraint=pb.Constraint(grammar="root ::= ("))
        with self.assertRaises(grpc.RpcError) as e:
            list(stub.Generate(bad, timeout=60 * time_scale()))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("constraint.grammar", e.exception.details())

    def test_every_bad_case_is_a_400_naming_its_construct(self):
        cases = bad_cases()
        self.assertGreaterEqual(len(cases), 25)
        for name, fields, words in cases:
            with self.assertRaises(openai.BadRequestError, msg=name) as e:
                self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=2, extra_body=fields)
            message = e.exception.body["message"]
            self.assertTrue(any(w.lower() in message.lower() for w in words), f"{name}: {message}")

    def test_refusals_name_the_field(self):
        cases = [
            ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
            ({"guided_grammar": "root ::= ("}, "guided_grammar"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
             "response_format.json_schema.schema"),
            ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
            ({"guided_json": {"type": "object"}, "ignore_eos": True}, "ignore_eos"),
        ]
        for extra, field in cases:
            with self.assertRaises(openai.BadRequestError, msg=field) as e:
                self.complete(extra, max_tokens=8)
            self.assertIn(field, str(e.exception))


class SpeculationTest(unittest.TestCase):
    def test_constraints_under_speculation(self):
        # A server that speculates accepts constrained requests: greedy, its output is the plain
        # server's; sampled, it follows the constraint; and drafts were verified under the grammar.
        cases = [({"json_schema": SCHEMA}, self.check_json), ({"structured_outputs": {"regex": PHONE}},
                 lambda text: self.assertRegex(text, "^" + PHONE + "$")),
                 ({"guided_grammar": GRAMMAR}, lambda text: self.assertIsNotNone(re.fullmatch(GRAMMAR_RE, text), text))]
        with Serve("--spec-method", "ngram", "--num-spec-tokens", "4") as spec, Serve() as plain:
            clients = [openai.OpenAI(base_url=s.http_base + "/v1", api_key="unused", max_retries=0,
                                     timeout=60 * time_scale()) for s in (spec, plain)]
            model = clients[0].models.list().data[0].id
            drafts = 0
            for extra, check in cases:
                greedy = [c.completions.create(model=model, prompt=PROMPT, max_tokens=200, temperature=0,
                                               extra_body=extra) for c in clients]
                self.assertEqual(greedy[0].choices[0].text, greedy[1].choices[0].text, extra)
                sampled = clients[0].completions.create(model=model, prompt=PROMPT, max_tokens=200, temperature=1,
                                                        seed=9, extra_body=extra)
                for r in (greedy[0], sampled):
                    self.assertEqual(r.choices[0].finish_reason, "stop", (extra, r.choices[0].text))
                    check(r.choices[0].text)
                    drafts += r.model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"]
            self.assertGreater(drafts, 0)
            assert spec.stop() == 0, spec.stderr()
            assert plain.stop() == 0, plain.stderr()

    def check_json(self, text):
        jsonschema.validate(json.loads(text), SCHEMA)


class ExperimentTest(unittest.TestCase):
    """Constrained lines of an experiment's prompts file, offline, online in process, and online against
    a real server over HTTP and gRPC (the load generator sends them as structured_outputs and
    `constraint`): every request completes, offline and online in process give the same greedy tokens,
    and the constraints hold each output to a few tokens where the bare model writes all of max_tokens."""

    def run_spec(self, d, name, extra, rate=""):
        spec = os.path.join(d, name + ".textproto")
        with open(spec, "w") as f:
            f.write(f'name: "{name}"\nmodel {{ path: "{TARGET}" tokenizer: "{TOKENIZER}" }}\n'
                    f'workload {{ prompts_file: "{os.path.join(d, "prompts.jsonl")}" num_requests: 8 max_tokens: 32 '
                    f'seed: 1 }}\nsweep {{ temperature: [0] {rate} }}\n{extra}')
        out = os.path.join(d, name)
        r = subprocess.run([BINARY, "experiment", "run", spec, "--out", out], capture_output=True, text=True,
                           timeout=300 * time_scale())
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "results.jsonl")) as f:
            return [json.loads(line) for line in f][0]

    def test_constrained_lines_on_every_path(self):
        with tempfile.TemporaryDirectory() as d, Serve() as serve:
            with open(os.path.join(d, "prompts.jsonl"), "w") as f:
                f.write(json.dumps({"prompt": PROMPT, "guided_choice": ["yes", "no"]}) + "\n")
                f.write(json.dumps({"prompt": "Lily and Tom", "structured_outputs": {"regex": "[0-9]{2}"}}) + "\n")
            online = "request_rate: [inf]"
            rows = [self.run_spec(d, "offline", ""), self.run_spec(d, "inproc", "mode: ONLINE\n", online),
                    self.run_spec(d, "http", f'mode: ONLINE\nendpoint: "http://{serve.http_base.split("//")[1]}"\n',
                                  online),
                    self.run_spec(d, "grpc", f'mode: ONLINE\nendpoint: "grpc://{serve.grpc_target}"\n', online)]
            assert serve.stop() == 0, serve.stderr()
        for row in rows:
            self.assertEqual(row["completed"], 8, row)
            self.assertLessEqual(row["output_tokens"], 8 * 4, row)  # bare, each would run to 32
        # In process (offline and online) the runs hash their tokens: the same greedy tokens.
        self.assertEqual(rows[0]["output_hash"], rows[1]["output_hash"])


class PromptsFileTest(unittest.TestCase):
    def test_prompts_file_line_constraint(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "prompts.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"prompt": PROMPT, "json_schema": SCHEMA, "temperature": 1, "seed": 4}) + "\n")
                f.write(json.dumps({"prompt": PROMPT, "structured_outputs": {"regex": PHONE}}) + "\n")
            out = subprocess.run([BINARY, "generate", "--model", TARGET, "--tokenizer", TOKENIZER, "--prompts-file",
                                  path, "--no-progress", "--max-tokens", "200"],
                                 capture_output=True, text=True, timeout=300 * time_scale())
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = {j["id"]: j for j in map(json.loads, filter(str.strip, out.stdout.splitlines()))}
        jsonschema.validate(json.loads(lines[1]["text"]), SCHEMA)
        self.assertRegex(lines[2]["text"], "^" + PHONE + "$")


if __name__ == "__main__":
    unittest.main()
