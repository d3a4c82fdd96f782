"""Clients of `specula serve` that know nothing of Specula's protos: one that learns every service
through server reflection alone (grpc.reflection.v1alpha, as grpcurl and Postman do), resolves every
method's message types from the FileDescriptorProtos the server sends (with their dependencies) and
calls grpc.health.v1.Health/Check and specula.v1.Generation/ModelInfo with messages built from them;
and a client that gzip-compresses its requests, which gets the same greedy tokens as one that
does not."""
import unittest

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from serving_util import PROMPTS, Serve, stubs, time_scale


class ReflectionClient:
    """Descriptors from server reflection only, in a pool of their own."""

    def __init__(self, channel):
        self.stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        self.pool = descriptor_pool.DescriptorPool()
        self.added = set()

    def ask(self, **request):
        resp = next(self.stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(**request)]),
                                                   timeout=10 * time_scale()))
        if resp.HasField("error_response"):
            raise LookupError(f"{request}: {resp.error_response.error_message}")
        return resp

    def services(self):
        return sorted(s.name for s in self.ask(list_services="").list_services_response.service)

    def load_symbol(self, symbol):
        """Adds the file that defines `symbol`, and the files it imports, to the pool."""
        sent = self.ask(file_containing_symbol=symbol).file_descriptor_response.file_descriptor_proto
        files = {}
        for blob in sent:
            fd = descriptor_pb2.FileDescriptorProto.FromString(blob)
            files[fd.name] = fd
        for name in list(files):
            self._add(name, files)

    def _add(self, name, files):
        """Adds `name` after its imports; an import the server did not send is asked for by name."""
        if name in self.added:
            return
        if name not in files:
            for blob in self.ask(file_by_filename=name).file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(blob)
                files.setdefault(fd.name, fd)
        for dep in files[name].dependency:
            self._add(dep, files)
        self.pool.Add(files[name])
        self.added.add(name)

    def unary(self, channel, service, method):
        """(request class, a callable for the method) built from the pool's descriptors."""
        m = self.pool.FindServiceByName(service).methods_by_name[method]
        req = message_factory.GetMessageClass(m.input_type)
        resp = message_factory.GetMessageClass(m.output_type)
        return req, channel.unary_unary(f"/{service}/{method}", request_serializer=req.SerializeToString,
                                        response_deserializer=resp.FromString)


class ReflectionOnlyClientTest(unittest.TestCase):
    def test_every_service_resolves_and_health_answers(self):
        with Serve() as s, grpc.insecure_channel(s.grpc_target) as ch:
            client = ReflectionClient(ch)
            services = client.services()
            for name in ("specula.v1.Generation", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"):
                self.assertIn(name, services)
            for name in services:
                client.load_symbol(name)
                service = client.pool.FindServiceByName(name)
                self.assertGreater(len(service.methods), 0, name)
                for m in service.methods:
                    for t in (m.input_type, m.output_type):
                        self.assertIsNotNone(message_factory.GetMessageClass(t), f"{name}/{m.name}: {t.full_name}")
            self.assertIn("grpc/health/v1/health.proto", client.added)
            check_req, check = client.unary(ch, "grpc.health.v1.Health", "Check")
            resp = check(check_req(service=""), timeout=10 * time_scale())
            serving = resp.DESCRIPTOR.fields_by_name["status"].enum_type.values_by_name["SERVING"].number
            self.assertEqual(resp.status, serving)
            # An unknown service is NOT_FOUND, as the protocol says.
            with self.assertRaises(grpc.RpcError) as e:
                check(check_req(service="no.such.Service"), timeout=10 * time_scale())
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            info_req, info = client.unary(ch, "specula.v1.Generation", "ModelInfo")
            self.assertEqual(info(info_req(), timeout=10 * time_scale()).vocab_size, 512)
            self.assertEqual(s.stop(), 0, s.stderr())


class GzipTest(unittest.TestCase):
    def test_gzip_requests_give_the_same_greedy_tokens(self):
        pb, pb_grpc = stubs()

        def tokens(channel, prompt, **kw):
            req = pb.GenerateRequest(prompt=prompt, sampling=pb.SamplingParams(temperature=0.0, max_tokens=32))
            msgs = pb_grpc.GenerationStub(channel).Generate(req, timeout=60 * time_scale(), **kw)
            return [t for m in msgs for t in m.token_ids]

        with Serve() as s, grpc.insecure_channel(s.grpc_target) as plain, \
                grpc.insecure_channel(s.grpc_target, compression=grpc.Compression.Gzip) as gz:
            for prompt in PROMPTS[:4]:
                expected = tokens(plain, prompt)
                self.assertGreater(len(expected), 0)
                self.assertEqual(tokens(gz, prompt), expected, prompt)
                self.assertEqual(tokens(plain, prompt, compression=grpc.Compression.Gzip), expected, prompt)
                self.assertEqual(tokens(plain, prompt, compression=grpc.Compression.Deflate), expected, prompt)
            self.assertEqual(s.stop(), 0, s.stderr())


if __name__ == "__main__":
    unittest.main()
