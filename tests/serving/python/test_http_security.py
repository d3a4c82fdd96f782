"""`specula serve` over HTTP with an API key and with TLS (serving/http_server.cc): the key guards
/v1/* (401 in OpenAI's error shape with `WWW-Authenticate: Bearer`, never echoing a key) while
/health and /metrics stay open; TLS serves a client that trusts the CA and no plaintext client;
with --ssl-ca-certs only clients with a certificate that CA signed get in. The certificates are
made at test time with the openssl CLI (test_grpc_security.make_pki)."""
import http.client
import json
import os
import ssl
import tempfile
import unittest

import openai

from serving_util import Serve, time_scale
from test_grpc_security import make_pki

KEY = "sk-specula-http-7d21e0"


def get(base, path, headers=None, context=None):
    """(status, headers, body) of GET base+path; base is http://host:port or https://host:port."""
    scheme, hostport = base.split("://")
    host, port = hostport.split(":")
    if scheme == "https":
        c = http.client.HTTPSConnection(host, int(port), timeout=30 * time_scale(), context=context)
    else:
        c = http.client.HTTPConnection(host, int(port), timeout=30 * time_scale())
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        c.close()


class HttpApiKeyTest(unittest.TestCase):
    def test_key_guards_the_api_but_not_health_or_metrics(self):
        with Serve("--api-key", KEY) as s:
            for headers, says in (({}, "missing"), ({"Authorization": "Bearer wrong-key"}, "invalid"),
                                  ({"Authorization": KEY}, "invalid")):
                status, h, body = get(s.http_base, "/v1/models", headers)
                self.assertEqual(status, 401, body)
                self.assertEqual(h.get("WWW-Authenticate"), "Bearer")
                error = json.loads(body)["error"]
                self.assertEqual(error["code"], 401)
                self.assertIsNone(error["param"])
                self.assertIn(says, error["message"])
                self.assertNotIn(KEY, body)
                self.assertNotIn("wrong-key", body)
            self.assertEqual(get(s.http_base, "/v1/models", {"Authorization": f"Bearer {KEY}"})[0], 200)
            self.assertEqual(get(s.http_base, "/health")[0], 200)
            self.assertEqual(get(s.http_base, "/metrics")[0], 200)
            with self.assertRaises(openai.AuthenticationError):
                openai.OpenAI(base_url=s.http_base + "/v1", api_key="wrong", max_retries=0).models.list()
            client = openai.OpenAI(base_url=s.http_base + "/v1", api_key=KEY, max_retries=0)
            out = client.completions.create(model=client.models.list().data[0].id, prompt="Once upon a time",
                                            max_tokens=4, temperature=0)
            self.assertEqual(out.usage.completion_tokens, 4)
            self.assertEqual(s.stop(), 0, s.stderr())


class HttpTlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        make_pki(cls.dir.name)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def context(self, client=None):
        ctx = ssl.create_default_context(cafile=self.path("ca.pem"))
        if client:
            ctx.load_cert_chain(self.path(f"{client}.pem"), self.path(f"{client}.key"))
        return ctx

    def test_tls_serves_a_trusting_client_and_no_plaintext_one(self):
        with Serve("--ssl-certfile", self.path("server.pem"), "--ssl-keyfile", self.path("server.key")) as s:
            https = s.http_base.replace("http://", "https://")
            status, _, body = get(https, "/v1/models", context=self.context())
            self.assertEqual(status, 200, body)
            with self.assertRaises((http.client.HTTPException, ConnectionError, OSError)):
                get(s.http_base, "/v1/models")  # plaintext to the TLS port: no HTTP answer
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_ca_certs_require_a_client_certificate_the_ca_signed(self):
        with Serve("--ssl-certfile", self.path("server.pem"), "--ssl-keyfile", self.path("server.key"),
                   "--ssl-ca-certs", self.path("ca.pem")) as s:
            https = s.http_base.replace("http://", "https://")
            for client in (None, "rogue"):
                with self.assertRaises((ssl.SSLError, ConnectionError, OSError, http.client.HTTPException)):
                    get(https, "/health", context=self.context(client))
            self.assertEqual(get(https, "/health", context=self.context("client"))[0], 200)
            self.assertEqual(s.stop(), 0, s.stderr())


if __name__ == "__main__":
    unittest.main()
