"""Hot reload on a real `specula serve`: POST /admin/reload, gRPC Admin.Reload and SIGHUP. The admin
routes need the server's API key and are refused without one; a request admitted before a reload
finishes on the model it started on (every chunk names that version); a missing or corrupt file, a
draft or a chat template for another vocabulary is refused by field while the old model keeps
serving; concurrent reloads run one after the other; the old model is freed after its last request;
/v1/models, the headers, gRPC and the metrics' label follow the new version."""
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import grpc
import openai

from serving_util import BINARY, DRAFT, SOURCE, TARGET, TOKENIZER, Serve, random_model, stubs, time_scale

KEY = "reload-test-key"
CHATML = os.path.join(SOURCE, "models", "chat_templates", "smollm2_tools.jinja")
_made = {}


def made_model(name, *flags):
    """A random-weight tiny model (`specula make-model`), written once per process."""
    if name not in _made:
        out = os.path.join(tempfile.mkdtemp(prefix="specula_reload_"), name)
        subprocess.run([BINARY, "make-model", "--shape", "tiny", "--out", out, *flags], check=True, capture_output=True)
        _made[name] = out
    return _made[name]


def post(s, path, body, key=KEY):
    """(status, JSON body) of a POST."""
    req = urllib.request.Request(s.http_base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=60 * time_scale()) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def complete(s, key=KEY, **kw):
    """(version header, system_fingerprint, text) of a short completion."""
    client = openai.OpenAI(base_url=s.http_base + "/v1", api_key=key, max_retries=0, timeout=30 * time_scale())
    raw = client.completions.with_raw_response.create(model=client.models.list().data[0].id, prompt="Once upon",
                                                      max_tokens=8, **kw)
    c = raw.parse()
    return raw.headers["x-specula-model-version"], c.system_fingerprint, c.choices[0].text


def models_version(s, key=KEY):
    req = urllib.request.Request(s.http_base + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["data"][0]["version"]


class AdminAccessTest(unittest.TestCase):
    def test_refused_without_a_configured_key(self):
        with Serve() as s:
            code, body = post(s, "/admin/reload", {"model": DRAFT}, key=None)
            self.assertEqual(code, 403)
            self.assertIn("--api-key", body["error"]["message"])
            pb, pb_grpc = stubs()
            with grpc.insecure_channel(s.grpc_target) as ch:
                with self.assertRaises(grpc.RpcError) as e:
                    pb_grpc.AdminStub(ch).Reload(pb.ReloadRequest(model=DRAFT), timeout=30)
                self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
            before = models_version(s)
            self.assertEqual(complete(s)[0], before)  # still the startup's model

    def test_key_required(self):
        with Serve("--api-key", KEY) as s:
            for key in (None, "wrong"):
                code, body = post(s, "/admin/reload", {"model": DRAFT}, key=key)
                self.assertEqual(code, 401, body)
            pb, pb_grpc = stubs()
            with grpc.insecure_channel(s.grpc_target) as ch:
                with self.assertRaises(grpc.RpcError) as e:
                    pb_grpc.AdminStub(ch).Reload(pb.ReloadRequest(model=DRAFT), timeout=30)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


class ReloadTest(unittest.TestCase):
    def test_bad_reloads_keep_the_old_model(self):
        corrupt = os.path.join(tempfile.mkdtemp(prefix="specula_reload_"), "truncated.bin")
        with open(TARGET, "rb") as f, open(corrupt, "wb") as out:
            out.write(f.read(4096))
        cases = [({"model": "/nonexistent/model.gguf"}, "model", "No such file"),
                 ({"model": corrupt, "tokenizer": TOKENIZER}, "model", "truncated"),
                 ({"model": DRAFT, "tokenizer": TOKENIZER, "chat_template": CHATML}, "chat_template",
                  "another vocabulary"),
                 ({"model": DRAFT, "draft_model": DRAFT}, "draft_model", "--spec-method none"),
                 ({"model": DRAFT, "tokenizer": TOKENIZER, "temperature": 1}, "temperature", "unknown field"),
                 ({"tokenizer": TOKENIZER}, "model", "required"),
                 ({"model": ""}, "model", "non-empty")]
        with Serve("--api-key", KEY) as s:
            version = models_version(s)
            for body, field, words in cases:
                code, err = post(s, "/admin/reload", body)
                self.assertEqual(code, 400, (body, err))
                self.assertEqual(err["error"]["param"], field, err)
                self.assertIn(words, err["error"]["message"])
                self.assertEqual(complete(s)[:2], (version, version), body)  # the old model still answers
            self.assertEqual(models_version(s), version)
            self.assertRegex(s.stderr(), "reload of /nonexistent/model.gguf refused")

    def test_a_draft_for_another_vocabulary_is_refused(self):
        a, b, wide = made_model("a"), made_model("b", "--seed", "1"), made_model("wide", "--vocab", "600")
        with Serve("--api-key", KEY, "--spec-method", "draft", "--draft-model", b, model=a, tokenizer=None) as s:
            version = models_version(s)
            code, err = post(s, "/admin/reload", {"model": wide})
            self.assertEqual(code, 400, err)
            self.assertEqual(err["error"]["param"], "draft_model", err)
            self.assertIn("vocabulary", err["error"]["message"])
            self.assertEqual(complete(s)[0], version)
            code, ok = post(s, "/admin/reload", {"model": b, "draft_model": a})  # the pair swapped: same vocabulary
            self.assertEqual(code, 200, ok)
            self.assertEqual(complete(s)[0], ok["model_version"])

    def test_in_flight_requests_finish_on_their_model(self):
        slow, other = random_model(), random_model("tiny")
        with Serve("--api-key", KEY, model=slow, tokenizer=None) as s:
            old = models_version(s)
            client = openai.OpenAI(base_url=s.http_base + "/v1", api_key=KEY, max_retries=0, timeout=120 * time_scale())
            stream = client.completions.create(model=client.models.list().data[0].id, prompt="Once upon a time",
                                               max_tokens=200, stream=True, extra_body={"ignore_eos": True})
            chunks = [next(stream)]  # admitted and running on the old model
            code, r = post(s, "/admin/reload", {"model": other})
            self.assertEqual(code, 200, r)
            self.assertEqual(r["previous_model_version"], old)
            self.assertGreaterEqual(r["previous_in_flight"], 1)
            new = r["model_version"]
            self.assertNotEqual(new, old)
            self.assertEqual(complete(s)[:2], (new, new))  # admitted after the switch: the new model
            chunks += list(stream)
            self.assertEqual({c.system_fingerprint for c in chunks}, {old})
            self.assertEqual(chunks[-1].choices[0].finish_reason, "length")
            # Its last request done, the old model is freed.
            deadline = time.time() + 30 * time_scale()
            while f"freed {slow} (version {old})" not in s.stderr() and time.time() < deadline:
                time.sleep(0.05)
            self.assertIn(f"freed {slow} (version {old})", s.stderr())
            self.assertEqual(models_version(s), new)
            with urllib.request.urlopen(s.http_base + "/metrics", timeout=30) as r:
                text = r.read().decode()
            self.assertEqual(set(re.findall(r'model_version="([^"]*)"', text)), {new})
            pb, pb_grpc = stubs()
            with grpc.insecure_channel(s.grpc_target) as ch:
                auth = (("authorization", f"Bearer {KEY}"),)
                info = pb_grpc.GenerationStub(ch).ModelInfo(pb.ModelInfoRequest(), metadata=auth, timeout=30)
                self.assertEqual(info.model_version, new)
                self.assertEqual(info.vocab_size, 512)

    def test_concurrent_reloads_run_one_after_the_other(self):
        with Serve("--api-key", KEY) as s:
            start = models_version(s)
            results = {}

            def reload(name, model):
                results[name] = post(s, "/admin/reload", {"model": model, "tokenizer": TOKENIZER,
                                                          "model_version": name})

            threads = [threading.Thread(target=reload, args=(n, m)) for n, m in (("one", DRAFT), ("two", TARGET))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual([results[n][0] for n in ("one", "two")], [200, 200], results)
            prev = {n: results[n][1]["previous_model_version"] for n in ("one", "two")}
            # Serialized: one replaced the startup's model, the other replaced that one.
            self.assertIn(prev, ({"one": start, "two": "one"}, {"one": "two", "two": start}))
            last = "two" if prev["two"] == "one" else "one"
            self.assertEqual(complete(s)[:2], (last, last))

    def test_bench_serve_names_each_response_version(self):
        # bench-serve with the key (--api-key, else $OPENAI_API_KEY) reads each response's version.
        with Serve("--api-key", KEY) as s:
            code, r = post(s, "/admin/reload", {"model": DRAFT, "tokenizer": TOKENIZER})
            self.assertEqual(code, 200, r)
            out = os.path.join(tempfile.mkdtemp(prefix="specula_reload_"), "b.json")
            for env_key, flag in ((None, ["--api-key", KEY]), (KEY, [])):
                env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
                if env_key:
                    env["OPENAI_API_KEY"] = env_key
                subprocess.run([BINARY, "bench-serve", "--endpoint", s.http_base, "--num-prompts", "6", "--input-len",
                                "8", "--output-len", "4", "--no-progress", "--save-detailed", "--result-json", out,
                                *flag], check=True, capture_output=True, timeout=120 * time_scale(), env=env)
                with open(out) as f:
                    res = json.load(f)
                self.assertEqual((res["completed"], res["failed"]), (6, 0))
                self.assertEqual(set(res["request_model_versions"]), {r["model_version"]})
            p = subprocess.run([BINARY, "bench-serve", "--endpoint", s.http_base, "--num-prompts", "2", "--no-progress"],
                               capture_output=True, text=True, timeout=120 * time_scale(),
                               env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"})
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("401", p.stderr)

    def test_grpc_reload_and_sighup(self):
        with Serve("--api-key", KEY) as s:
            start = models_version(s)
            pb, pb_grpc = stubs()
            auth = (("authorization", f"Bearer {KEY}"),)
            with grpc.insecure_channel(s.grpc_target) as ch:
                r = pb_grpc.AdminStub(ch).Reload(pb.ReloadRequest(model=DRAFT, tokenizer=TOKENIZER), metadata=auth,
                                                 timeout=60)
                self.assertEqual(r.previous_model_version, start)
                self.assertNotEqual(r.model_version, start)
                call = pb_grpc.GenerationStub(ch).Generate(
                    pb.GenerateRequest(prompt="Once", sampling=pb.SamplingParams(max_tokens=4)), metadata=auth,
                    timeout=30)
                self.assertEqual(list(call)[-1].model_version, r.model_version)
                self.assertEqual(dict(call.initial_metadata())["x-specula-model-version"], r.model_version)
                with self.assertRaises(grpc.RpcError) as e:
                    pb_grpc.AdminStub(ch).Reload(pb.ReloadRequest(model="/nonexistent.bin"), metadata=auth, timeout=60)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("model: /nonexistent.bin", e.exception.details())
            s.proc.send_signal(signal.SIGHUP)  # the startup's model again
            deadline = time.time() + 60 * time_scale()
            while "reloaded " + TARGET not in s.stderr() and time.time() < deadline:
                time.sleep(0.05)
            self.assertIn(f"version {start} (was {r.model_version})", s.stderr())
            self.assertEqual(complete(s)[0], start)
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main()
