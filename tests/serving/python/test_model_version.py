"""The served model's version (`specula serve --model-version`, default a hash of the weights) in every
response of a real server: HTTP's X-Specula-Model-Version header (errors and probes included) and
OpenAI's system_fingerprint (read by the openai client), /v1/models, gRPC's initial metadata, the last
message's model_version and ModelInfo, and a label on every metric."""
import re
import subprocess
import unittest
import urllib.error
import urllib.request

import grpc
import openai

from serving_util import BINARY, DRAFT, TARGET, TOKENIZER, Serve, stubs, time_scale


def versions(s):
    """The version as each surface of server `s` names it."""
    out = {}
    client = openai.OpenAI(base_url=s.http_base + "/v1", api_key="none", max_retries=0, timeout=30 * time_scale())
    model = client.models.list().data[0]
    out["models"] = model.model_extra["version"]
    raw = client.completions.with_raw_response.create(model=model.id, prompt="Once upon a time", max_tokens=4)
    out["header"] = raw.headers["x-specula-model-version"]
    out["fingerprint"] = raw.parse().system_fingerprint
    chunks = list(client.completions.create(model=model.id, prompt="Once", max_tokens=4, stream=True))
    out["stream"] = {c.system_fingerprint for c in chunks}
    try:
        urllib.request.urlopen(s.http_base + "/nowhere", timeout=10)
    except urllib.error.HTTPError as e:
        out["404 header"] = e.headers["X-Specula-Model-Version"]
    pb, pb_grpc = stubs()
    with grpc.insecure_channel(s.grpc_target) as ch:
        stub = pb_grpc.GenerationStub(ch)
        call = stub.Generate(pb.GenerateRequest(prompt="Once", sampling=pb.SamplingParams(max_tokens=4)), timeout=30)
        out["grpc last"] = list(call)[-1].model_version
        out["grpc metadata"] = dict(call.initial_metadata())["x-specula-model-version"]
        out["grpc info"] = stub.ModelInfo(pb.ModelInfoRequest(), timeout=30).model_version
    text = urllib.request.urlopen(s.http_base + "/metrics", timeout=10).read().decode()
    samples = [l for l in text.splitlines() if l and not l.startswith("#")]
    out["metrics"] = {m.group(1) if (m := re.search(r'model_version="([^"]*)"', l)) else None for l in samples}
    return out


class ModelVersionTest(unittest.TestCase):
    def assert_everywhere(self, got, version):
        self.assertEqual(got, {"header": version, "fingerprint": version, "stream": {version}, "models": version,
                               "404 header": version, "grpc last": version, "grpc metadata": version,
                               "grpc info": version, "metrics": {version}})

    def test_default_is_the_weights_hash(self):
        with Serve() as a, Serve(model=DRAFT) as b:
            va, vb = versions(a)["header"], versions(b)["header"]
            self.assertRegex(va, r"^[0-9a-f]{16}$")
            self.assertNotEqual(va, vb)  # other weights, another version
            self.assert_everywhere(versions(a), va)
        with Serve() as again:
            self.assertEqual(versions(again)["header"], va)  # the same weights, the same version

    def test_given_version(self):
        with Serve("--model-version", "stories-v2.1") as s:
            self.assert_everywhere(versions(s), "stories-v2.1")

    def test_bad_version_refused_at_startup(self):
        for bad in ("", "has space", "x" * 129):
            p = subprocess.run([BINARY, "serve", "--model", TARGET, "--tokenizer", TOKENIZER, "--grpc-port", "0",
                                "--http-port", "0", "--model-version", bad], capture_output=True, text=True,
                               timeout=60 * time_scale())
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("--model-version: ", p.stderr)


if __name__ == "__main__":
    unittest.main()
