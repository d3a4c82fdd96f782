"""`specula serve --http-port -1` (gRPC only) with an API key and with TLS, driven by grpcio: the key
guards specula.v1.Generation (UNAUTHENTICATED without it or with a wrong one, never echoing either)
while health and reflection stay open; TLS serves a client that trusts the CA and no plaintext
client; with --ssl-ca-certs only clients with a certificate that CA signed get in; bad PEM files
stop the server at startup with an error naming the flag. The certificates are made at test time
with the openssl CLI (scripts/install_deps.sh installs it)."""
import os
import re
import subprocess
import tempfile
import unittest

import grpc

from serving_util import BINARY, TARGET, TOKENIZER, Serve, stubs, time_scale

pb, pb_grpc = stubs()
KEY = "sk-specula-test-5f3a9c"
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(d, *args):
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)


def make_pki(d):
    """In d: a throwaway CA (ca.pem), server.pem/.key for 127.0.0.1 and localhost and client.pem/.key,
    both signed by the CA, and rogue.pem/.key, a self-signed client certificate."""
    openssl(d, "req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=specula test CA")
    exts = {"server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            "client": "extendedKeyUsage=clientAuth\n"}
    for name, ext in exts.items():
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext)
        openssl(d, "req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=specula test {name}")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    openssl(d, "req", "-x509", *EC, "-keyout", "rogue.key", "-out", "rogue.pem", "-days", "2", "-subj", "/CN=rogue")


def read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def model_info(channel, metadata=None):
    return pb_grpc.GenerationStub(channel).ModelInfo(pb.ModelInfoRequest(), metadata=metadata,
                                                     timeout=10 * time_scale())


def generate_tokens(channel, metadata=None):
    req = pb.GenerateRequest(prompt="Once upon a time", sampling=pb.SamplingParams(temperature=0.0, max_tokens=8))
    msgs = pb_grpc.GenerationStub(channel).Generate(req, metadata=metadata, timeout=60 * time_scale())
    return [t for m in msgs for t in m.token_ids]


class ApiKeyTest(unittest.TestCase):
    def assert_refused(self, call, *must_say):
        with self.assertRaises(grpc.RpcError) as e:
            call()
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED, e.exception.details())
        for text in must_say:
            self.assertIn(text, e.exception.details())
        self.assertNotIn(KEY, e.exception.details())
        self.assertNotIn("wrong-key", e.exception.details())

    def test_key_guards_generation_but_not_health_or_reflection(self):
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
        with Serve("--api-key", KEY, http=False) as s, grpc.insecure_channel(s.grpc_target) as ch:
            self.assertIsNone(s.http_base)
            stub = pb_grpc.GenerationStub(ch)
            wrong = [("authorization", "Bearer wrong-key")]
            for md in (None, [("authorization", KEY)], [("authorization", "Basic " + KEY)]):
                self.assert_refused(lambda: generate_tokens(ch, md), "authorization", "Bearer")
            self.assert_refused(lambda: generate_tokens(ch, wrong), "API key")
            self.assert_refused(lambda: model_info(ch), "missing")
            self.assert_refused(lambda: model_info(ch, wrong), "API key")
            self.assert_refused(lambda: stub.Tokenize(pb.TokenizeRequest(text="hi"), timeout=10 * time_scale()))
            good = [("authorization", f"Bearer {KEY}")]
            self.assertGreater(len(generate_tokens(ch, good)), 0)
            self.assertEqual(model_info(ch, good).vocab_size, 512)
            self.assertGreater(len(stub.Tokenize(pb.TokenizeRequest(text="hi"), metadata=good,
                                                 timeout=10 * time_scale()).token_ids), 0)
            # Probes need no key.
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10 * time_scale())
            self.assertEqual(health.status, health_pb2.HealthCheckResponse.SERVING)
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            resp = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                  timeout=10 * time_scale()))
            self.assertIn("specula.v1.Generation", {sv.name for sv in resp.list_services_response.service})
            self.assertEqual(s.stop(), 0, s.stderr())


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="specula_tls_")
        cls.d = cls.tmp.name
        make_pki(cls.d)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.d, name)

    def tls_flags(self):
        return ["--ssl-certfile", self.path("server.pem"), "--ssl-keyfile", self.path("server.key")]

    def secure(self, target, client=None):
        creds = grpc.ssl_channel_credentials(
            root_certificates=read(self.d, "ca.pem"),
            private_key=read(self.d, f"{client}.key") if client else None,
            certificate_chain=read(self.d, f"{client}.pem") if client else None)
        return grpc.secure_channel(target, creds)

    def assert_no_connection(self, channel):
        with self.assertRaises(grpc.RpcError) as e:
            model_info(channel)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())

    def test_tls_serves_a_client_that_trusts_the_ca_and_no_plaintext_client(self):
        with Serve(*self.tls_flags(), http=False) as s:
            with self.secure(s.grpc_target) as ch:
                self.assertEqual(model_info(ch).vocab_size, 512)
                self.assertGreater(len(generate_tokens(ch)), 0)
            with grpc.insecure_channel(s.grpc_target) as ch:
                self.assert_no_connection(ch)
            # A client that trusts another CA does not trust this server.
            creds = grpc.ssl_channel_credentials(root_certificates=read(self.d, "rogue.pem"))
            with grpc.secure_channel(s.grpc_target, creds) as ch:
                self.assert_no_connection(ch)
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_client_certificates_signed_by_the_ca_are_required(self):
        with Serve(*self.tls_flags(), "--ssl-ca-certs", self.path("ca.pem"), "--api-key", KEY, http=False) as s:
            with self.secure(s.grpc_target) as ch:
                self.assert_no_connection(ch)
            with self.secure(s.grpc_target, client="rogue") as ch:
                self.assert_no_connection(ch)
            with self.secure(s.grpc_target, client="client") as ch:
                self.assertGreater(len(generate_tokens(ch, [("authorization", f"Bearer {KEY}")])), 0)
                # TLS does not replace the key.
                with self.assertRaises(grpc.RpcError) as e:
                    model_info(ch)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(s.stop(), 0, s.stderr())

    def test_bad_pem_files_are_refused_at_startup_by_flag(self):
        not_pem = self.path("not_pem.txt")
        with open(not_pem, "w") as f:
            f.write("hello\n")
        pem = read(self.d, "server.pem").decode()
        corrupt = self.path("corrupt.pem")
        with open(corrupt, "w") as f:  # the markers, with the body's bytes changed
            f.write(pem.replace(pem.splitlines()[3], "A" * len(pem.splitlines()[3])))
        key, cert = self.path("server.key"), self.path("server.pem")
        cases = [
            (["--ssl-certfile", not_pem, "--ssl-keyfile", key], f"--ssl-certfile: {re.escape(not_pem)}: no PEM"),
            (["--ssl-certfile", corrupt, "--ssl-keyfile", key],
             f"--ssl-certfile: {re.escape(corrupt)}: certificate 1 does not parse"),
            (["--ssl-certfile", cert, "--ssl-keyfile", not_pem], f"--ssl-keyfile: {re.escape(not_pem)}: no .*private key"),
            (["--ssl-certfile", cert, "--ssl-keyfile", self.path("client.key")],
             "--ssl-keyfile: .*client.key: not the key of --ssl-certfile"),
            ([*self.tls_flags(), "--ssl-ca-certs", key], f"--ssl-ca-certs: {re.escape(key)}: no PEM"),
        ]
        for flags, message in cases:
            out = subprocess.run([BINARY, "serve", "--model", TARGET, "--tokenizer", TOKENIZER, "--grpc-port", "0",
                                  "--http-port", "-1", *flags], capture_output=True, text=True,
                                 timeout=60 * time_scale())
            self.assertNotEqual(out.returncode, 0, flags)
            self.assertRegex(out.stderr, message)
            self.assertNotIn("ready", out.stderr)


if __name__ == "__main__":
    unittest.main()
