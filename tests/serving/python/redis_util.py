"""A redis-server of the test's own, as tests/kvstore/redis_fixture.h starts one for the C++ tests: its
own process on a unix socket in a fresh temporary directory (no TCP port, no persistence, 64 MB with
LRU eviction), never the system's service; killed (SIGKILL, as a crash) at the end.

    with RedisServer() as redis:
        Serve("--kv-store", redis.url, ...)
        redis.kill()
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from serving_util import time_scale

SKIP_REASON = "redis-server is not on PATH (scripts/install_deps.sh installs the redis-server package)"


def available():
    return shutil.which("redis-server") is not None


class RedisServer:
    """`maxmemory`: the store's budget (LRU eviction past it)."""

    def __init__(self, maxmemory="64mb"):
        # Short: a socket's path has at most 107 bytes.
        self.dir = tempfile.mkdtemp(prefix="specula_redis_", dir="/tmp")
        self.socket_path = os.path.join(self.dir, "redis.sock")
        self.url = "unix://" + self.socket_path
        self.maxmemory = maxmemory
        self.start()

    def start(self):
        """Starts it (again, empty, after kill())."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru",
             "--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log"), "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 5 * time_scale()
        while not self.answers():
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer on {self.socket_path}; its log:\n{self.log()}")
            time.sleep(0.01)

    def answers(self):
        """One PING on a fresh connection, answered within 200 ms."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.2)
                s.connect(self.socket_path)
                s.sendall(b"PING\r\n")
                return s.recv(1) in (b"+", b"-")
        except OSError:
            return False

    def log(self):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()
        except OSError:
            return ""

    def kill(self):
        """SIGKILL: connections drop, the socket file stays, the data is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
