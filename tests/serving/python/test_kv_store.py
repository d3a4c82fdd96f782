"""The serving surfaces of shared KV against real `specula serve` processes (the TinyStories target) and a
real redis-server of the test's own (redis_util.py):

- cache_salt on HTTP completions and chat and on gRPC: the same salt shares the prefix cache, another
  salt (or none) does not, the samples of n > 1 share theirs; an empty, non-string or too long salt is
  a 400 (gRPC: INVALID_ARGUMENT) naming cache_salt;
- POST /reset_prefix_cache empties the local prefix cache ({"reset": true, "blocks": N}), takes the API
  key as /v1/* does (401 without it), and is POST only (405);
- two replicas with --kv-store on one redis: a prompt on A, the prompt and more on B: B fetches A's
  blocks (cached tokens, metrics.kv_store, gRPC's kv_store), its greedy text is a third server's without
  a store, the store's Prometheus counters show A's writes and B's hits; salts keep replicas apart
  too; with redis killed B still answers the same text and counts the failures;
- the flags: rediss:// refused by name, a bound without --kv-store refused by name, a store that does
  not answer at startup is a warning and the server serves.
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import unittest

import grpc

sys.path.insert(0, os.path.dirname(__file__))
import redis_util  # noqa: E402
from serving_util import (BINARY, TARGET, TOKENIZER, Serve, metric, metrics, plain_chat_template, stubs,  # noqa: E402
                          time_scale)

pb, pb_grpc = stubs()
KEY = "sk-specula-kv-5c81"
# About 100 tokens (6 full blocks of 16) after a lead that each test varies, so that no test finds
# another's blocks.
STORY = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
         "friends and her dog Max. One day she saw a big red ball under a tree, and she ran to get it. ")
MORE = "Then her mom called her home for dinner, and Lily said goodbye to Max and the ball."
MAX_TOKENS = 16
KV_COUNTERS = ("fetches", "hit_blocks", "miss_blocks", "read_bytes", "written_bytes", "writes", "dropped_writes",
               "timeouts", "errors", "fetch_seconds", "installed_blocks", "rejected_blocks", "install_seconds")


def call(base, method, path, body=None, key=None):
    """(status, the JSON body or None) of one HTTP request to base (http://host:port)."""
    host, port = base.split("://")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60 * time_scale())
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        c.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = c.getresponse()
        text = r.read().decode()
        return r.status, json.loads(text) if text else None
    finally:
        c.close()


def complete(base, prompt, key=None, chat=False, **fields):
    """A greedy completion (chat: one user message of `prompt`): (status, body)."""
    body = {"max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return call(base, "POST", "/v1/chat/completions" if chat else "/v1/completions", body, key)


def ok(test, reply):
    """The body of a 200, failing `test` otherwise."""
    status, body = reply
    test.assertEqual(status, 200, body)
    return body


def text_of(body):
    c = body["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def cached(body):
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def stream(base, prompt):
    """A streamed greedy completion with its usage chunk: (text, the usage chunk)."""
    host, port = base.split("://")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60 * time_scale())
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, r.read()
        events = [line[len("data: "):] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    finally:
        c.close()
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    return "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"]), chunks[-1]


def generate(stub, prompt, salt="", n=1):
    """Every message of one greedy gRPC Generate call."""
    sampling = pb.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, n=n)
    return list(stub.Generate(pb.GenerateRequest(prompt=prompt, sampling=sampling, cache_salt=salt),
                              metadata=(("authorization", f"Bearer {KEY}"),), timeout=60 * time_scale()))


def block_size(grpc_target):
    """The server's KV block size (gRPC ModelInfo)."""
    with grpc.insecure_channel(grpc_target) as ch:
        info = pb_grpc.GenerationStub(ch).ModelInfo(pb.ModelInfoRequest(), metadata=(("authorization", f"Bearer {KEY}"),),
                                                    timeout=10 * time_scale())
    return info.block_size


def last_of(msgs, index=0):
    return [m for m in msgs if m.index == index][-1]


def kv_counters(http_base):
    """Every specula:kv_store_*_total counter, by its short name (a counter missing fails the lookup)."""
    m = metrics(http_base)
    return {c: m[(f"specula:kv_store_{c}_total", frozenset())] for c in KV_COUNTERS}


class CacheSaltAndResetTest(unittest.TestCase):
    """One server with an API key and a chat template that writes the messages' text."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.server = Serve("--api-key", KEY, "--chat-template", plain_chat_template(cls.dir.name, separator=""))
        cls.base = cls.server.http_base

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        cls.dir.cleanup()

    def test_the_same_salt_shares_the_prefix_cache_and_another_does_not(self):
        for chat in (False, True):
            prompt = ("Chat. " if chat else "Anna and her cat. ") + STORY
            first = ok(self, complete(self.base, prompt, KEY, chat, cache_salt="alpha"))
            self.assertEqual(cached(first), 0, chat)
            again = ok(self, complete(self.base, prompt, KEY, chat, cache_salt="alpha"))
            self.assertGreater(cached(again), 0, chat)
            for other in ({"cache_salt": "beta"}, {}):
                body = ok(self, complete(self.base, prompt, KEY, chat, **other))
                self.assertEqual(cached(body), 0, (chat, other))
                self.assertEqual(text_of(body), text_of(first), (chat, other))
            self.assertEqual(text_of(again), text_of(first), chat)
            self.assertNotIn("metrics", first)  # no store: no kv_store timings

    def test_a_bad_salt_is_refused_by_name(self):
        for chat in (False, True):
            for salt in ("", 7, ["a"], {"s": 1}, "x" * 1025):
                status, body = complete(self.base, "Once upon a time", KEY, chat, cache_salt=salt)
                self.assertEqual(status, 400, (chat, salt, body))
                self.assertEqual(body["error"]["param"], "cache_salt", body)
                self.assertIn("cache_salt", body["error"]["message"])
            ok(self, complete(self.base, "Once upon a time", KEY, chat, cache_salt="x" * 1024))
            ok(self, complete(self.base, "Once upon a time", KEY, chat, cache_salt=None))  # null: none

    def test_grpc_salt_and_samples(self):
        with grpc.insecure_channel(self.server.grpc_target) as ch:
            stub = pb_grpc.GenerationStub(ch)
            prompt = "Grpc and the fox. " + STORY
            first = last_of(generate(stub, prompt, "alpha"))
            self.assertEqual(first.usage.cached_prompt_tokens, 0)
            self.assertFalse(first.HasField("kv_store"))  # no store
            self.assertGreater(last_of(generate(stub, prompt, "alpha")).usage.cached_prompt_tokens, 0)
            self.assertEqual(last_of(generate(stub, prompt, "beta")).usage.cached_prompt_tokens, 0)
            self.assertEqual(last_of(generate(stub, prompt)).usage.cached_prompt_tokens, 0)  # "": none
            self.assertGreater(last_of(generate(stub, prompt)).usage.cached_prompt_tokens, 0)
            # n > 1: sample 1 starts once sample 0 has a token and finds its prompt's blocks under the salt.
            samples = generate(stub, "Two samples. " + STORY, "gamma", n=2)
            self.assertEqual(last_of(samples, 0).usage.cached_prompt_tokens, 0)
            self.assertGreater(last_of(samples, 1).usage.cached_prompt_tokens, 0)
            self.assertEqual(last_of(generate(stub, "Two samples. " + STORY, "delta")).usage.cached_prompt_tokens, 0)
            with self.assertRaises(grpc.RpcError) as e:
                generate(stub, prompt, "x" * 1025)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("cache_salt", e.exception.details())

    def test_reset_prefix_cache(self):
        prompt = "Ben and the reset. " + STORY
        first = ok(self, complete(self.base, prompt, KEY))
        hit = cached(ok(self, complete(self.base, prompt, KEY)))
        self.assertGreater(hit, 0)
        for key in (None, "wrong"):
            status, body = call(self.base, "POST", "/reset_prefix_cache", key=key)
            self.assertEqual(status, 401, body)
        self.assertGreater(cached(ok(self, complete(self.base, prompt, KEY))), 0)  # the refusals reset nothing
        status, body = call(self.base, "GET", "/reset_prefix_cache", key=KEY)
        self.assertEqual(status, 405, body)
        status, body = call(self.base, "POST", "/reset_prefix_cache", key=KEY)
        self.assertEqual(status, 200, body)
        self.assertIs(body["reset"], True)
        self.assertGreaterEqual(body["blocks"], hit // block_size(self.server.grpc_target))  # this prompt's at least
        after = ok(self, complete(self.base, prompt, KEY))
        self.assertEqual(cached(after), 0)
        self.assertEqual(text_of(after), text_of(first))
        self.assertEqual(call(self.base, "GET", "/health")[0], 200)  # still open without the key


@unittest.skipUnless(redis_util.available(), redis_util.SKIP_REASON)
class SharedStoreTest(unittest.TestCase):
    """Replicas A and B share one redis; C has no store and gives the text to compare with."""

    def test_replicas_share_blocks_and_survive_the_store(self):
        with redis_util.RedisServer() as redis, Serve("--kv-store", redis.url) as a, \
                Serve("--kv-store", redis.url) as b, Serve() as c:
            self.check_http(a.http_base, b.http_base, c.http_base, block_size(b.grpc_target))
            self.check_grpc(a.http_base, b.grpc_target, c.grpc_target)
            self.check_salts(a.http_base, b.http_base)
            ka, kb, kc = kv_counters(a.http_base), kv_counters(b.http_base), kv_counters(c.http_base)
            self.assertGreater(ka["writes"], 0)
            self.assertGreater(ka["written_bytes"], 0)
            for k in ("fetches", "hit_blocks", "read_bytes", "installed_blocks"):
                self.assertGreater(kb[k], 0, k)
            self.assertEqual(kb["rejected_blocks"], 0)
            self.assertEqual(ka["errors"] + ka["timeouts"] + kb["errors"] + kb["timeouts"], 0)
            self.assertEqual(set(kc.values()), {0.0})
            redis.kill()
            prompt = "After the store. " + STORY + MORE
            lost = ok(self, complete(b.http_base, prompt))
            self.assertEqual(text_of(lost), text_of(ok(self, complete(c.http_base, prompt))))
            self.assertEqual(lost["metrics"]["kv_store"]["fetched_tokens"], 0)
            kb = kv_counters(b.http_base)
            self.assertGreater(kb["errors"] + kb["timeouts"], 0)
            for s in (a, b, c):
                self.assertEqual(s.stop(), 0, s.stderr())

    def check_http(self, a, b, c, block):
        prompt = "Whole. " + STORY
        first = ok(self, complete(a, prompt))
        self.assertEqual(first["metrics"]["kv_store"]["fetched_tokens"], 0)
        got = ok(self, complete(b, prompt + MORE))
        store = got["metrics"]["kv_store"]
        self.assertGreater(store["fetched_tokens"], 0, got)
        self.assertEqual(store["fetched_tokens"] % block, 0)  # whole blocks
        self.assertGreaterEqual(cached(got), store["fetched_tokens"])
        self.assertGreaterEqual(store["fetch_ms"], 0)
        self.assertGreater(store["install_ms"], 0)
        reference = ok(self, complete(c, prompt + MORE))
        self.assertNotIn("metrics", reference)
        self.assertEqual(text_of(got), text_of(reference))
        # Streamed: the usage chunk carries the same.
        prompt = "Streamed. " + STORY
        ok(self, complete(a, prompt))
        text, usage = stream(b, prompt + MORE)
        self.assertGreater(usage["metrics"]["kv_store"]["fetched_tokens"], 0, usage)
        self.assertGreaterEqual(usage["usage"]["prompt_tokens_details"]["cached_tokens"],
                                usage["metrics"]["kv_store"]["fetched_tokens"])
        self.assertEqual(text, text_of(ok(self, complete(c, prompt + MORE))))

    def check_grpc(self, a, b, c):
        prompt = "Over gRPC. " + STORY
        ok(self, complete(a, prompt))
        with grpc.insecure_channel(b) as bch, grpc.insecure_channel(c) as cch:
            got = generate(pb_grpc.GenerationStub(bch), prompt + MORE)
            reference = generate(pb_grpc.GenerationStub(cch), prompt + MORE)
        last = got[-1]
        self.assertTrue(last.HasField("kv_store"))
        self.assertGreater(last.kv_store.fetched_tokens, 0)
        self.assertGreaterEqual(last.usage.cached_prompt_tokens, last.kv_store.fetched_tokens)
        self.assertGreater(last.kv_store.install_ms, 0)
        self.assertFalse(reference[-1].HasField("kv_store"))
        self.assertEqual([t for m in got for t in m.token_ids], [t for m in reference for t in m.token_ids])

    def check_salts(self, a, b):
        prompt = "Salted. " + STORY
        ok(self, complete(a, prompt, cache_salt="tenant-1"))
        other = ok(self, complete(b, prompt + MORE, cache_salt="tenant-2"))
        self.assertEqual(other["metrics"]["kv_store"]["fetched_tokens"], 0)
        self.assertEqual(cached(other), 0)
        same = ok(self, complete(b, prompt + MORE, cache_salt="tenant-1"))
        self.assertGreater(same["metrics"]["kv_store"]["fetched_tokens"], 0)


class KvStoreFlagsTest(unittest.TestCase):
    def refused(self, *flags):
        """The exit status and stderr of a serve that must stop before it serves."""
        r = subprocess.run([BINARY, "serve", "--model", TARGET, "--tokenizer", TOKENIZER, "--grpc-port", "0",
                            "--http-port", "0", *flags], capture_output=True, text=True, timeout=60 * time_scale())
        return r.returncode, r.stderr

    def test_rediss_is_refused_by_name(self):
        rc, err = self.refused("--kv-store", "rediss://x:6379")
        self.assertNotEqual(rc, 0)
        self.assertIn("rediss", err)
        self.assertNotIn("ready", err)

    def test_a_bound_without_a_store_is_refused_by_name(self):
        rc, err = self.refused("--kv-store-ttl-s", "5")
        self.assertNotEqual(rc, 0)
        self.assertIn("--kv-store-ttl-s", err)

    def test_a_store_that_does_not_answer_is_a_warning(self):
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            with Serve("--kv-store", f"unix://{d}/absent.sock") as s:
                self.assertIn("warning", s.stderr())
                self.assertIn("does not answer", s.stderr())
                body = ok(self, complete(s.http_base, "No store. " + STORY))
                self.assertIn(body["choices"][0]["finish_reason"], ("stop", "length"))
                self.assertGreater(body["usage"]["completion_tokens"], 0)
                self.assertEqual(body["metrics"]["kv_store"]["fetched_tokens"], 0)
                counters = kv_counters(s.http_base)
                self.assertGreater(counters["errors"] + counters["timeouts"], 0)
                self.assertEqual(s.stop(), 0, s.stderr())


if __name__ == "__main__":
    unittest.main()
