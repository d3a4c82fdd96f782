"""scripts/fleet.sh and deploy/nginx/: three real `specula serve` replicas of stories260K, a
redis-server and nginx, all on loopback in a directory of the test's own. Sessions stay on one
replica over HTTP and gRPC (X-Specula-Replica, and nginx's access log), requests without a session
spread over the replicas, a replica killed with SIGKILL costs no request that was not on it (the
retry), and `down` leaves nothing running. Bad input (a replica count of 0, a taken port, a missing
model) fails at once and starts nothing. Skipped, and reported skipped, without nginx or
redis-server on PATH."""
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from serving_util import (BINARY, DRAFT, SOURCE, TARGET, TOKENIZER, free_port_block, metric, metrics,
                          plain_chat_template)

FLEET = os.path.join(SOURCE, "scripts", "fleet.sh")
TOOLS = shutil.which("nginx") and shutil.which("redis-server")


def fleet(*args, timeout=120):
    return subprocess.run(["bash", FLEET, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def fleet_pids(d):
    pids = {}
    for name in os.listdir(d):
        if name.endswith(".pid"):
            with open(os.path.join(d, name)) as f:
                pids[name[:-4]] = int(f.read())
    return pids


def fleet_env(d):
    with open(os.path.join(d, "fleet.env")) as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


def complete(base, model, session=None, stream=False):
    """POST /v1/completions through nginx: (status, the replica header)."""
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 8, "stream": stream}).encode()
    headers = {"Content-Type": "application/json"}
    if session:
        headers["X-Session-Id"] = session
    with urllib.request.urlopen(urllib.request.Request(f"http://{base}/v1/completions", body, headers), timeout=30) as r:
        r.read()
        return r.status, r.headers.get("X-Specula-Replica")


@unittest.skipUnless(TOOLS, "nginx or redis-server is not on PATH (scripts/install_deps.sh installs both)")
class FleetBadInputTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fleet-bad-")
        self.base = free_port_block(10)

    def tearDown(self):
        fleet("down", "--dir", self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)

    def up(self, *args):
        t0 = time.monotonic()
        r = fleet("up", *args, "--dir", self.dir, "--specula", BINARY, "--http-port", str(self.base),
                  "--grpc-port", str(self.base + 1), "--base-port", str(self.base + 2), "--", "--tokenizer", TOKENIZER)
        self.assertNotEqual(r.returncode, 0, r.stderr)
        self.assertLess(time.monotonic() - t0, 5, "a bad input is refused at once")
        self.assertEqual({n: p for n, p in fleet_pids(self.dir).items() if alive(p)}, {}, "nothing left running")
        return r.stderr

    def test_replica_count_zero(self):
        self.assertIn("replica count: '0' is not an integer >= 1", self.up("0", "--model", TARGET))

    def test_missing_model(self):
        self.assertIn("--model: '/nonexistent/model.bin': no such file", self.up("2", "--model", "/nonexistent/model.bin"))

    def test_taken_port(self):
        taken = socket.socket()
        taken.bind(("127.0.0.1", self.base + 4))  # replica 1's HTTP port
        taken.listen()
        try:
            err = self.up("2", "--model", TARGET)
        finally:
            taken.close()
        self.assertIn(f"port {self.base + 4} on 127.0.0.1 is taken", err)
        self.assertIn("replica 1's HTTP port", err)

    def test_bad_canary_flags(self):
        self.assertIn("--canary-weight: needs --canary-model", self.up("1", "--model", TARGET, "--canary-weight", "20"))
        self.assertIn("--canary-weight: '150' is not a percentage",
                      self.up("1", "--model", TARGET, "--canary-model", DRAFT, "--canary-weight", "150"))
        self.assertIn("--canary-model: '/nonexistent/v2.bin': no such file",
                      self.up("1", "--model", TARGET, "--canary-model", "/nonexistent/v2.bin"))
        taken = socket.socket()
        taken.bind(("127.0.0.1", self.base + 6))  # replica 2's HTTP port: the canary's
        taken.listen()
        try:
            self.assertIn("replica 2's HTTP port", self.up("2", "--model", TARGET, "--canary-model", DRAFT))
        finally:
            taken.close()


def murmur2(data):
    """nginx's ngx_murmur_hash2, which split_clients hashes its key with."""
    m, h = 0x5bd1e995, len(data)
    for i in range(0, len(data) - len(data) % 4, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * m) & 0xffffffff
        k = ((k ^ (k >> 24)) * m) & 0xffffffff
        h = ((h * m) & 0xffffffff) ^ k
    tail = data[len(data) - len(data) % 4:]
    for i in reversed(range(len(tail))):
        h ^= tail[i] << (8 * i)
    if tail:
        h = (h * m) & 0xffffffff
    h = ((h ^ (h >> 13)) * m) & 0xffffffff
    return h ^ (h >> 15)


@unittest.skipUnless(TOOLS, "nginx or redis-server is not on PATH (scripts/install_deps.sh installs both)")
class FleetCanaryTest(unittest.TestCase):
    """One stable replica of stories260K and a canary of its draft (other weights: another version)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fleet-canary-")
        base = free_port_block(6)
        self.http = f"127.0.0.1:{base}"
        r = fleet("up", "1", "--model", TARGET, "--canary-model", DRAFT, "--canary-weight", "30", "--no-redis",
                  "--dir", self.dir, "--specula", BINARY, "--http-port", str(base), "--grpc-port", str(base + 1),
                  "--base-port", str(base + 2), "--", "--tokenizer", TOKENIZER)
        if r.returncode != 0:
            fleet("down", "--dir", self.dir)
            raise AssertionError(f"fleet up failed:\n{r.stderr}")
        self.stable = self.version_of(fleet_env(self.dir)["REPLICA_0_HTTP"])
        self.canary = self.version_of(fleet_env(self.dir)["REPLICA_1_HTTP"])

    def tearDown(self):
        fleet("down", "--dir", self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def version_of(addr):
        return json.load(urllib.request.urlopen(f"http://{addr}/v1/models", timeout=10))["data"][0]["version"]

    def versions(self, sessions, turns=2):
        """{session: the set of versions its turns got}, through nginx under the stable model's name."""
        out = collections.defaultdict(set)
        for t in range(turns):
            for s in sessions:
                body = json.dumps({"model": TARGET, "prompt": "Once", "max_tokens": 2}).encode()
                q = urllib.request.Request(f"http://{self.http}/v1/completions", body,
                                           {"Content-Type": "application/json", "X-Session-Id": s})
                with urllib.request.urlopen(q, timeout=30) as r:
                    out[s].add(r.headers["X-Specula-Model-Version"])
        return out

    def test_sessions_split_by_hash_and_moved_by_weight(self):
        self.assertNotEqual(self.stable, self.canary)
        sessions = [f"user-{i}" for i in range(80)]
        got = self.versions(sessions)
        self.assertEqual([s for s, v in got.items() if len(v) != 1], [], "a session on two versions")
        # split_clients gives the first 30% of the MurmurHash2 range to the canary: predictable offline.
        expected = {s for s in sessions if murmur2(s.encode()) < 0.30 * 2**32}
        self.assertEqual({s for s, v in got.items() if v == {self.canary}}, expected)
        self.assertTrue(0 < len(expected) < len(sessions))
        r = fleet("weight", "60", "--dir", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        wider = {s for s, v in self.versions(sessions, 1).items() if v == {self.canary}}
        self.assertTrue(expected < wider, "a wider canary keeps its sessions and takes more")
        for w, version in (("0", self.stable), ("100", self.canary)):
            self.assertEqual(fleet("weight", w, "--dir", self.dir).returncode, 0)
            self.assertEqual(set().union(*self.versions(sessions[:20], 1).values()), {version}, f"weight {w}")
        self.assertIn("weight: '-5' is not a percentage", fleet("weight", "-5", "--dir", self.dir).stderr)


@unittest.skipUnless(TOOLS, "nginx or redis-server is not on PATH (scripts/install_deps.sh installs both)")
class FleetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fleet-")
        template = plain_chat_template(cls.dir)  # each message's content on its own line
        base = free_port_block(8)
        cls.http, cls.grpc = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
        r = fleet("up", "3", "--model", TARGET, "--dir", cls.dir, "--specula", BINARY, "--http-port", str(base),
                  "--grpc-port", str(base + 1), "--base-port", str(base + 2), "--fail-timeout-s", "30",
                  "--", "--tokenizer", TOKENIZER, "--chat-template", template)
        if r.returncode != 0:
            fleet("down", "--dir", cls.dir)
            raise AssertionError(f"fleet up failed:\n{r.stderr}")
        cls.model = json.load(urllib.request.urlopen(f"http://{cls.http}/v1/models", timeout=10))["data"][0]["id"]

    @classmethod
    def tearDownClass(cls):
        fleet("down", "--dir", cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def access_log(self):
        with open(os.path.join(self.dir, "access.log")) as f:
            return [json.loads(line) for line in f if line.strip()]

    def bench(self, endpoint, sessions, turns):
        out = os.path.join(self.dir, f"bench-{time.monotonic_ns()}.json")
        r = subprocess.run([BINARY, "bench-serve", "--endpoint", endpoint, "--multi-turn", "--num-sessions", str(sessions),
                            "--turns", str(turns), "--max-tokens", "8", "--session-concurrency", "4", "--no-progress",
                            "--save-detailed", "--result-json", out, "--seed", str(time.monotonic_ns() % 1000)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            return json.load(f)["requests"]

    def assert_sticky(self, requests):
        by = collections.defaultdict(set)
        for r in requests:
            self.assertEqual(r["outcome"], "ok", r)
            self.assertRegex(r["replica"], r"^replica-[0-2]$")
            by[r["session_id"]].add(r["replica"])
        self.assertTrue(all(len(v) == 1 for v in by.values()), dict(by))
        return {next(iter(v)) for v in by.values()}

    def test_1_sessions_stay_on_one_replica(self):
        used = self.assert_sticky(self.bench(f"http://{self.http}", 24, 3))
        self.assertGreaterEqual(len(used), 2, "24 sessions spread over the replicas")
        self.assert_sticky(self.bench(f"grpc://{self.grpc}", 12, 2))
        # nginx's own record agrees: one upstream per session.
        seen = collections.defaultdict(set)
        for line in self.access_log():
            if line["session"]:
                seen[line["session"]].add(line["upstream"])
        self.assertGreaterEqual(len(seen), 36)
        self.assertTrue(all(len(v) == 1 for v in seen.values()), dict(seen))

    def test_2_requests_without_a_session_spread(self):
        replicas = collections.Counter(complete(self.http, self.model)[1] for _ in range(9))
        self.assertEqual(set(replicas), {"replica-0", "replica-1", "replica-2"}, replicas)
        status, replica = complete(self.http, self.model, session="stream-check", stream=True)
        self.assertEqual((status, replica is not None), (200, True))

    def sessions_on(self, replica, tries=60):
        """Session ids that nginx sends to `replica`, found by asking."""
        return [s for s in (f"{replica}-{i}" for i in range(tries))
                if complete(self.http, self.model, session=s)[1] == replica]

    def test_3_a_draining_replicas_503_is_retried_elsewhere(self):
        mine = self.sessions_on("replica-1")
        self.assertGreaterEqual(len(mine), 3)
        direct = fleet_env(self.dir)["REPLICA_1_HTTP"]
        # Long generations straight to replica 1 keep its drain open while the sessions come in.
        body = json.dumps({"model": self.model, "prompt": "Once upon a time", "max_tokens": 400,
                           "ignore_eos": True}).encode()

        def admitted():  # requests replica 1 took: running, waiting or finished
            m = metrics(f"http://{direct}")
            return sum(metric(m, f"specula:num_requests_{state}") for state in ("running", "waiting")) + sum(
                metric(m, "specula:request_success_total", finished_reason=r) for r in ("stop", "length", "abort"))
        before = admitted()
        long_ones = ThreadPoolExecutor(48)
        futures = [long_ones.submit(urllib.request.urlopen, urllib.request.Request(
            f"http://{direct}/v1/completions", body, {"Content-Type": "application/json"}), timeout=120)
            for _ in range(48)]
        # Every one admitted before the drain starts (a request that comes after it gets a 503).
        deadline = time.monotonic() + 10
        while admitted() - before < 48:
            self.assertLess(time.monotonic(), deadline, "the long requests never all reached replica 1")
            time.sleep(0.005)
        os.kill(fleet_pids(self.dir)["replica-1"], signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{direct}/health", timeout=2)
            except urllib.error.HTTPError as e:
                if e.code == 503:
                    break
            time.sleep(0.002)
        else:
            self.fail("replica 1 never reported draining")
        landed = [complete(self.http, self.model, session=s) for s in mine[:3]]
        self.assertTrue(all(st == 200 and rep != "replica-1" for st, rep in landed), landed)
        statuses = [l["upstream_status"] for l in self.access_log() if l["session"] in mine[:3]][-3:]
        self.assertIn("503, 200", statuses, "the drain's 503 went to another replica")
        self.assertTrue(all(f.result().status == 200 for f in futures), "the drain let the long ones finish")
        long_ones.shutdown()

    def test_4_a_killed_replica_costs_no_other_request(self):
        pids = fleet_pids(self.dir)
        mine = self.sessions_on("replica-2")
        self.assertGreaterEqual(len(mine), 3)
        os.kill(pids["replica-2"], signal.SIGKILL)
        landed = [complete(self.http, self.model, session=s) for s in mine]
        self.assertTrue(all(st == 200 and rep == "replica-0" for st, rep in landed), landed)
        retried = [l for l in self.access_log() if l["session"] in mine and "," in l["upstream"]]
        self.assertGreaterEqual(len(retried), 1, "the first request after the kill was retried on another replica")
        self.assertTrue(all(l["status"] == 200 and l["upstream_status"].startswith("502, ") for l in retried), retried)
        # Marked down: later requests of those sessions no longer try it (fail_timeout 30 s).
        victim = fleet_env(self.dir)["REPLICA_2_HTTP"]
        later = [complete(self.http, self.model, session=s) for s in mine]
        self.assertTrue(all(st == 200 for st, _ in later))
        tail = self.access_log()[-len(mine):]
        self.assertFalse(any(victim in l["upstream"] for l in tail), tail)
        st = fleet("status", "--dir", self.dir)
        self.assertNotEqual(st.returncode, 0, "status reports the dead replica")
        self.assertRegex(st.stdout, r"replica-2\s+down")

    def test_0_each_process_has_its_command_line_pid_and_log(self):
        for i in range(3):
            with open(os.path.join(self.dir, f"replica-{i}.cmd")) as f:
                self.assertIn(f"--replica-id replica-{i}", f.read())
            self.assertTrue(os.path.exists(os.path.join(self.dir, f"replica-{i}.log")))
        for name in ("nginx", "redis", "replica-0", "replica-1", "replica-2"):
            self.assertIn(name, fleet_pids(self.dir))
        st = fleet("status", "--dir", self.dir)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        self.assertEqual(len(re.findall(r"running .* health 200", st.stdout)), 4, st.stdout)

    def test_5_down_stops_everything(self):
        pids = fleet_pids(self.dir)
        r = fleet("down", "--dir", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([n for n, p in pids.items() if alive(p)], [])
        self.assertEqual(fleet_pids(self.dir), {})


if __name__ == "__main__":
    unittest.main()
