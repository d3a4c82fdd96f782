"""The request boundary end to end: the same minimal request (a prompt and nothing else) through HTTP
/v1/completions, /v1/chat/completions, gRPC Generate and a `specula generate --prompts-file` line, on
TinyStories, each checked against its row of the table of defaults that `specula serve --help`
prints (request/boundary.h; docs/architecture.md, "The request boundary").

The test reads each row's max_tokens default from --help and chooses only the configuration: serve's
and generate's --max-tokens, a chat template for a model that has none, and generate's --ignore-eos
(a prompts-file line inherits it). A minimal HTTP or gRPC request cannot ignore EOS, and the server
takes no --ignore-eos for its requests: there the prompts stop mid-sentence, where a story does not
end, and the lengths asked for are short (the first sampled request of a fresh server draws from
seed 1, the next from 2, so the run is the same each time).
A second prompt leaves less room in the context than the defaults: the rows say whether a default
is then refused, capped to the room, or runs to the context's end.
"""
import json
import os
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

import grpc

from serving_util import BINARY, TARGET, TOKENIZER, Serve, stubs, time_scale

MAX_TOKENS_FLAG = 12  # serve's and generate's --max-tokens: the rows that read it default to this
PROMPT = "Once upon a time, there was a little"
SENTENCE = "Lily and Ben played with a ball in the park. "
TAIL = "Then they saw a big"
ROOM_AT_MOST = 6  # the long prompt leaves 1 to this many tokens; both defaults ask for more


def help_table():
    """{row name: {column: cell}} from `specula serve --help`'s table."""
    out = subprocess.run([BINARY, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    lines = [l for l in out.splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(header, cells))
    return rows


def expected_default(cell):
    """A "max_tokens absent" cell as (tokens, what past the room): "16; past the room: refused" or
    "--max-tokens (256); past the room: capped"."""
    source, past = cell.split("; past the room: ")
    tokens = MAX_TOKENS_FLAG if source.startswith("--max-tokens") else int(source)
    return tokens, past


def http_post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60 * time_scale()) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class RequestBoundaryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.table = help_table()
        cls.dir = tempfile.TemporaryDirectory()
        template = os.path.join(cls.dir.name, "content.jinja")
        with open(template, "w") as f:  # the messages' text as it is: TinyStories has no chat template
            f.write("{% for message in messages %}{{ message['content'] }}{% endfor %}")
        cls.serve = Serve("--max-tokens", MAX_TOKENS_FLAG, "--chat-template", template)
        pb, pb_grpc = stubs()
        cls.pb = pb
        cls.channel = grpc.insecure_channel(cls.serve.grpc_target)
        cls.stub = pb_grpc.GenerationStub(cls.channel)
        cls.context = cls.stub.ModelInfo(pb.ModelInfoRequest(), timeout=10 * time_scale()).max_model_len
        cls.long_prompt = cls.fill_context()

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.serve.stop() == 0, cls.serve.stderr()
        cls.dir.cleanup()

    @classmethod
    def fill_context(cls):
        """A prompt that leaves 1 to ROOM_AT_MOST tokens of the context (BOS included, as serving
        counts a text prompt), ending mid-sentence: the most words of repeated sentences that fit."""
        def tokens(k):
            req = cls.pb.TokenizeRequest(text=" ".join(words[:k] + [TAIL]), add_special_tokens=True)
            return len(cls.stub.Tokenize(req, timeout=10 * time_scale()).token_ids)
        words = (SENTENCE * cls.context).split()
        lo, hi = 0, len(words)  # tokens(lo) leaves room; tokens(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if tokens(mid) < cls.context else (lo, mid)
        assert 1 <= cls.context - tokens(lo) <= ROOM_AT_MOST, (tokens(lo), cls.context)
        return " ".join(words[:lo] + [TAIL])

    def check(self, row, tokens, finish, prompt_tokens, what):
        """`tokens` and `finish` as the row's default says for a prompt of `prompt_tokens`."""
        want, past = expected_default(self.table[row]["max_tokens absent"])
        room = self.context - prompt_tokens
        if want > room:
            self.assertIn(past, ("capped", "runs to the context's end"), f"{row}: {what}")
            want = room
        self.assertNotEqual(finish, "stop", f"{row}: {what} hit EOS after {tokens} tokens, before the default showed")
        self.assertEqual(tokens, want, f"{row}: {what}")
        self.assertEqual(finish, "length", f"{row}: {what}")

    def test_the_help_table_covers_the_surfaces(self):
        for row in ("completions", "chat", "grpc", "prompts-file"):
            self.assertIn(row, self.table)
        out = subprocess.run([BINARY, "generate", "--help"], capture_output=True, text=True, check=True).stdout
        self.assertIn(self.table["prompts-file"]["max_tokens absent"], out)  # generate prints the same table

    def test_http_completions(self):
        for prompt, what in ((PROMPT, "a short prompt"), (self.long_prompt, "a prompt that leaves little room")):
            code, body = http_post(self.serve.http_base, "/v1/completions", {"prompt": prompt})
            _, past = expected_default(self.table["completions"]["max_tokens absent"])
            if code != 200:  # a default past the room, where the row refuses it
                self.assertEqual(past, "refused", body)
                self.assertEqual(code, 400, body)
                self.assertEqual(body["error"]["param"], "max_tokens", body)
                continue
            self.check("completions", body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"],
                       body["usage"]["prompt_tokens"], what)

    def test_http_chat(self):
        for prompt, what in ((PROMPT, "a short prompt"), (self.long_prompt, "a prompt that leaves little room")):
            code, body = http_post(self.serve.http_base, "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": prompt}]})
            self.assertEqual(code, 200, body)
            self.check("chat", body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"],
                       body["usage"]["prompt_tokens"], what)

    def test_grpc(self):
        finish = {self.pb.FINISH_REASON_STOP: "stop", self.pb.FINISH_REASON_LENGTH: "length"}
        for prompt, what in ((PROMPT, "a short prompt"), (self.long_prompt, "a prompt that leaves little room")):
            msgs = list(self.stub.Generate(self.pb.GenerateRequest(prompt=prompt), timeout=60 * time_scale()))
            tokens = sum(len(m.token_ids) for m in msgs)
            self.check("grpc", tokens, finish.get(msgs[-1].finish_reason, "other"), msgs[-1].usage.prompt_tokens, what)

    def test_prompts_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "prompts.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"prompt": PROMPT}) + "\n" + json.dumps({"prompt": self.long_prompt}) + "\n")
            out = subprocess.run([BINARY, "generate", "--model", TARGET, "--tokenizer", TOKENIZER, "--prompts-file",
                                  path, "--no-progress", "--ignore-eos", "--max-tokens", str(MAX_TOKENS_FLAG)],
                                 capture_output=True, text=True, timeout=300 * time_scale())
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = {j["id"]: j for j in map(json.loads, filter(str.strip, out.stdout.splitlines()))}
        self.assertEqual(sorted(lines), [1, 2], out.stdout)  # ids: the line numbers
        for line, what in ((1, "a short prompt"), (2, "a prompt that leaves little room")):
            j = lines[line]
            self.check("prompts-file", len(j["token_ids"]), j["finish_reason"], j["prompt_tokens"], what)


if __name__ == "__main__":
    unittest.main()
