"""Shared helpers for the serving tests: a real `specula serve` process on loopback, the gRPC stubs
(generated from proto/ with grpc_tools into a temporary directory), and offline reference runs.

Environment: SPECULA_BINARY (the built `specula`), SPECULA_SOURCE_DIR (the repository),
SPECULA_MODELS (the tinystories directory; default models/tinystories), and
SPECULA_SANITIZER (`tsan`: the binary is a ThreadSanitizer build, 5-15x slower; the tests' time
limits are multiplied by time_scale(), their assertions stay the same; `asan`: an ASan build, for
which test_overload runs a shorter overload with looser latency limits).
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SOURCE = os.environ.get("SPECULA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../..")))
BINARY = os.environ.get("SPECULA_BINARY", os.path.join(SOURCE, "build/release/specula"))
MODELS = os.environ.get("SPECULA_MODELS", os.path.join(SOURCE, "models/tinystories"))
TARGET = os.path.join(MODELS, "stories260K.bin")
DRAFT = os.path.join(MODELS, "stories260K-draft.bin")
TOKENIZER = os.path.join(MODELS, "tok512.bin")

SANITIZER = os.environ.get("SPECULA_SANITIZER", "")


def time_scale():
    """The factor on time limits (waits, deadlines, latency bounds): 10 for a ThreadSanitizer build."""
    return 10.0 if SANITIZER == "tsan" else 1.0


READY = re.compile(r"on grpc (\S+):(\d+) and http (?:(\S+):(\d+)|off).*ready")

_stubs = None


def stubs():
    """(generation_pb2, generation_pb2_grpc), generated once per process."""
    global _stubs
    if _stubs is None:
        from grpc_tools import protoc
        out = tempfile.mkdtemp(prefix="specula_stubs_")
        proto_dir = os.path.join(SOURCE, "proto")
        rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
                          os.path.join(proto_dir, "specula/v1/generation.proto")])
        assert rc == 0, "protoc failed"
        sys.path.insert(0, out)
        from specula.v1 import generation_pb2, generation_pb2_grpc  # noqa: E402
        _stubs = (generation_pb2, generation_pb2_grpc)
    return _stubs


class Serve:
    """`specula serve` on free loopback ports. Use as a context manager; stop() sends SIGTERM.
    http=False: gRPC only (`--http-port -1`; http_base is None)."""

    def __init__(self, *extra, model=TARGET, tokenizer=TOKENIZER, ready_timeout=60, http=True):
        self.args = [BINARY, "serve", "--model", model, "--host", "127.0.0.1", "--grpc-port", "0",
                     "--http-port", "0" if http else "-1",
                     *(["--tokenizer", tokenizer] if tokenizer else []), *map(str, extra)]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        deadline = time.time() + ready_timeout * time_scale()
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"specula serve exited ({self.proc.wait()}) before it was ready:\n" +
                                   "".join(self.lines))
            self.lines.append(line)
            m = READY.search(line)
            if m:
                self.grpc_target = f"{m.group(1)}:{m.group(2)}"
                self.http_base = f"http://{m.group(3)}:{m.group(4)}" if m.group(3) else None
                break
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("specula serve was not ready in time:\n" + "".join(self.lines))
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self, timeout=60):
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout * time_scale())
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def stderr(self):
        return "".join(self.lines)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        self.proc.stderr.close()
        # A sanitizer's report fails the test even where the test did not look at the exit status.
        if exc_type is None and re.search(r"WARNING: ThreadSanitizer|ERROR: AddressSanitizer|runtime error:",
                                          self.stderr()):
            raise AssertionError("specula serve reported:\n" + self.stderr())


_random_models = {}


def random_model(shape="stories15m"):
    """A random-weight HF model of a named shape (`specula make-model`), written once per process:
    slow enough (~1 ms a token) that a request is still running when a test cancels it."""
    if shape not in _random_models:
        out = os.path.join(tempfile.mkdtemp(prefix="specula_model_"), shape)
        subprocess.run([BINARY, "make-model", "--shape", shape, "--out", out], check=True, capture_output=True)
        _random_models[shape] = out
    return _random_models[shape]


def rss_mb(pid):
    """The process's resident set size, MB (VmRSS of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def p99(values):
    """The nearest-rank 99th percentile; NaN for no values."""
    v = sorted(values)
    return v[max(0, -(-99 * len(v) // 100) - 1)] if v else float("nan")


def wait_kv_empty(test, http_base, seconds, what):
    """Polls /metrics until the KV cache is empty and nothing runs (fails `test` after `seconds`);
    returns the last metrics, where nothing waits either."""
    deadline = time.time() + seconds
    while True:
        m = metrics(http_base)
        if metric(m, "specula:kv_cache_usage_perc") == 0 and metric(m, "specula:num_requests_running") == 0:
            break
        test.assertLess(time.time(), deadline, f"KV cache not empty after {what}")
        time.sleep(0.05)
    test.assertEqual(metric(m, "specula:num_requests_waiting"), 0)
    return m


def plain_chat_template(directory, separator="\n"):
    """A chat template file in `directory` for the TinyStories model, which has none: each message's
    content followed by `separator`. Returns its path."""
    path = os.path.join(directory, "plain.jinja")
    with open(path, "w") as f:
        f.write("{% for m in messages %}{{ m['content'] }}" + separator + "{% endfor %}")
    return path


def free_port_block(n):
    """A port with n free ports on 127.0.0.1 from it on (each bound once, as a server binds it). Taken
    below the ephemeral range, where no client connection takes a local port: after a load test,
    thousands of TIME_WAIT sockets hold ephemeral ports, and a block of them is rarely free."""
    import random
    import socket
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low, high = (10000, ephemeral_low - n) if ephemeral_low - n > 10000 else (1024, 65535 - n)
    for _ in range(200):
        base = random.randint(low, high)
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                t.bind(("127.0.0.1", p))
                socks.append(t)
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError(f"no block of {n} free ports in [{low}, {high + n})")


def machine():
    """The CPU's model name, its core count, architecture and host: a measurement's machine."""
    import platform
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, {platform.machine()}, {platform.node()}"


def metrics(http_base):
    """/metrics parsed by prometheus_client: {(sample name, frozenset(labels)): value}, without the labels
    every series carries (model_name, model_version, engine)."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(http_base + "/metrics", timeout=10 * time_scale()).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "model_version", "engine")}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def metric(m, name, **labels):
    return m.get((name, frozenset(labels.items())), 0.0)


def generate_batch(prompts, max_tokens, *extra, model=TARGET, tokenizer=TOKENIZER):
    """`specula generate --prompts-file` over the prompts: {index: its output line (a dict)}."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "prompts.jsonl")
        with open(path, "w") as f:
            for i, p in enumerate(prompts):
                f.write(json.dumps({"id": i, "prompt": p, "max_tokens": max_tokens}) + "\n")
        out = subprocess.run([BINARY, "generate", "--model", model, *(["--tokenizer", tokenizer] if tokenizer else []),
                              "--prompts-file", path, "--no-progress", *map(str, extra)],
                             capture_output=True, text=True, check=True).stdout
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    return {j["id"]: j for j in lines}


def offline_greedy(prompts, max_tokens, *extra):
    """`specula generate --prompts-file` over the prompts: {index: token ids}."""
    return {i: j["token_ids"] for i, j in generate_batch(prompts, max_tokens, *extra).items()}


PROMPTS = ["Once upon a time", "Lily and Ben", "The little dog", "One day, Tom", "There was a big tree",
           "Sue had a red ball", "The sun was hot", "Mom said", "The cat sat", "A bird flew",
           "Tim liked cars", "The park was", "Anna found a box", "It was raining", "The boy ran",
           "Max and his mom", "Under the bed", "The big fish", "A small girl", "In the garden"]
