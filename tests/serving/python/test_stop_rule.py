"""One stop rule for every path: 20 prompts (tests/data/stop_rule_prompts.txt), greedy, 400 tokens
and the model's own end tokens, through `generate --prompt` (one process each, --json),
`generate --prompts-file`, and a real `specula serve` over HTTP (the openai wire format) and gRPC.
Each path must give the same tokens (HTTP: the same text and count) and the same finish reason.

Two models: stories260K.bin, whose stories end with BOS (llama2.c's mark, which its config lists
among the end tokens), and a `make-model` directory whose config.json lists two eos_token_id values
that differ from its tokenizer's EOS (chosen among tokens the model does generate, so that some
requests end there and the rule is exercised)."""
import concurrent.futures
import json
import os
import subprocess
import tempfile
import unittest
import urllib.request

import grpc

from serving_util import BINARY, SOURCE, TARGET, TOKENIZER, Serve, generate_batch, random_model, stubs, time_scale

pb, pb_grpc = stubs()
MAX_TOKENS = 400
with open(os.path.join(SOURCE, "tests/data/stop_rule_prompts.txt")) as f:
    PROMPTS = [line.rstrip("\n") for line in f if line.strip()]
FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


def model_args(model, tokenizer):
    return ["--model", model, *(["--tokenizer", tokenizer] if tokenizer else [])]


def single(model, tokenizer, prompt, *extra):
    """`generate --prompt P --json`: (token ids, finish reason, text)."""
    out = subprocess.run([BINARY, "generate", *model_args(model, tokenizer), "--prompt", prompt, "--max-tokens",
                          str(MAX_TOKENS), "--json", *extra], capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    return j["token_ids"], j["finish_reason"], j["text"]


def batch(model, tokenizer, *extra):
    """`generate --prompts-file`: {index: (token ids, finish reason, text)}."""
    lines = generate_batch(PROMPTS, MAX_TOKENS, *extra, model=model, tokenizer=tokenizer)
    return {i: (j["token_ids"], j["finish_reason"], j["text"]) for i, j in lines.items()}


def served(model, tokenizer):
    """The prompts through one `specula serve`, concurrently: ({i: (ids, finish)} over gRPC,
    {i: (text, finish, completion tokens)} over HTTP)."""
    def grpc_one(stub, prompt):
        sampling = pb.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        msgs = list(stub.Generate(pb.GenerateRequest(prompt=prompt, sampling=sampling), timeout=300 * time_scale()))
        return [t for m in msgs for t in m.token_ids], FINISH[msgs[-1].finish_reason]

    def http_one(base, prompt):
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
        req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300 * time_scale()) as r:
            j = json.loads(r.read())
        c = j["choices"][0]
        return c["text"], c["finish_reason"], j["usage"]["completion_tokens"]

    with Serve(model=model, tokenizer=tokenizer) as s, grpc.insecure_channel(s.grpc_target) as ch:
        stub = pb_grpc.GenerationStub(ch)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            by_grpc = list(pool.map(lambda p: grpc_one(stub, p), PROMPTS))
            by_http = list(pool.map(lambda p: http_one(s.http_base, p), PROMPTS))
        s.stop()
    return dict(enumerate(by_grpc)), dict(enumerate(by_http))


class StopRuleTest(unittest.TestCase):
    def check_paths(self, model, tokenizer):
        """Runs every path; returns the batch results (the reference)."""
        ref = batch(model, tokenizer)
        self.assertEqual(sorted(ref), list(range(len(PROMPTS))))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            singles = list(pool.map(lambda p: single(model, tokenizer, p), PROMPTS))
        by_grpc, by_http = served(model, tokenizer)
        for i, prompt in enumerate(PROMPTS):
            tokens, finish, text = ref[i]
            what = f"prompt {i} ({prompt!r}) on {os.path.basename(model)}"
            self.assertEqual(singles[i], (tokens, finish, text), "generate --prompt, " + what)
            self.assertEqual(by_grpc[i], (tokens, finish), "gRPC, " + what)
            self.assertEqual(by_http[i], (text, finish, len(tokens)), "HTTP, " + what)
        return ref

    def test_stories_end_where_every_path_ends_them(self):
        ref = self.check_paths(TARGET, TOKENIZER)
        # Stories end with BOS (id 1) well before 400 tokens: the rule is exercised, not just length.
        stopped = [i for i, (tokens, finish, _) in ref.items() if finish == "stop"]
        self.assertGreaterEqual(len(stopped), 10, [f for _, f, _ in ref.values()])
        self.assertTrue(all(ref[i][0][-1] == 1 for i in stopped))

    def test_config_eos_ids_that_differ_from_the_tokenizer_eos(self):
        src = random_model("tiny")
        model = os.path.join(tempfile.mkdtemp(prefix="specula_eos_"), "tiny")
        subprocess.run(["cp", "-r", src, model], check=True)
        free = batch(model, None, "--ignore-eos")
        with open(os.path.join(model, "tokenizer.json")) as f:
            specials = {t["id"] for t in json.load(f)["added_tokens"]}
        # Two ids the model generates, not special (the tokenizer's EOS is among the specials), that
        # end some requests early: the one in the most outputs, then the one in the most of the rest.
        def outputs_with(t, among):
            return {i for i in among if t in free[i][0][1:]}
        candidates = {t for ids, _, _ in free.values() for t in ids} - specials
        everyone = set(free)
        a = max(sorted(candidates), key=lambda t: len(outputs_with(t, everyone)))
        b = max(sorted(candidates - {a}), key=lambda t: len(outputs_with(t, everyone - outputs_with(a, everyone))))
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
        config["eos_token_id"] = [a, b]
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(config, f)
        ref = self.check_paths(model, None)
        stopped = [i for i, (tokens, finish, _) in ref.items() if finish == "stop"]
        self.assertGreaterEqual(len(stopped), 5, (a, b, [f for _, f, _ in ref.values()]))
        self.assertTrue(all(ref[i][0][-1] in (a, b) for i in stopped))
        self.assertTrue(all(len(ref[i][0]) < len(free[i][0]) for i in stopped))


if __name__ == "__main__":
    unittest.main()
