"""`specula bench-serve --multi-turn` against two real `specula serve` processes (TinyStories with a
plain chat template: each message's content on its own line) and a small Python HTTP server that
stands in for an endpoint and records what each turn sends: turns rotate between the replicas, each
turn's prompt holds the one before it and the answer received, the prefix cache's share is read
back, the conversation's id reaches the server, each answer's replica (--replica-id) is recorded and
counted per replica, and a failing endpoint ends only the conversations on it."""
import json
import os
import subprocess
import tempfile
import threading
import unittest
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from serving_util import BINARY, Serve, plain_chat_template, time_scale



class FakeEndpoint:
    """An OpenAI endpoint on loopback: GET /v1/models, and POST /v1/chat/completions answering
    "answer to N messages" as a stream with usage (prompt_tokens 10 N, cached_tokens 2 N), or, with
    fail=True, HTTP 500. Records each chat request's X-Session-Id header and body."""

    def __init__(self, fail=False):
        self.requests = []  # (session id header, body)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, body, content_type="application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply(200, json.dumps({"object": "list", "data": [{"id": "fake"}]}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append((self.headers.get("X-Session-Id"), body))
                if fail:
                    self.reply(500, json.dumps({"error": {"message": "replica down", "code": 500}}))
                    return
                n = len(body["messages"])
                chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                          {"choices": [{"index": 0, "delta": {"content": f"answer to {n}"}}]},
                          {"choices": [{"index": 0, "delta": {"content": " messages"}}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                          {"choices": [], "usage": {"prompt_tokens": 10 * n, "completion_tokens": 2,
                                                    "prompt_tokens_details": {"cached_tokens": 2 * n}}}]
                self.reply(200, "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n",
                           "text/event-stream")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def by_session(result):
    """--save-detailed's requests: {session id: [turn 0's, turn 1's, ...]}."""
    out = defaultdict(list)
    for r in sorted(result["requests"], key=lambda r: (r["session"], r["turn"])):
        out[r["session_id"]].append(r)
    return dict(out)


class MultiTurnTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        template = plain_chat_template(cls.tmp.name)
        cls.servers = [Serve("--chat-template", template, "--replica-id", f"mt-{i}") for i in range(2)]

    @classmethod
    def tearDownClass(cls):
        for s in cls.servers:
            assert s.stop() == 0, s.stderr()
            s.__exit__(None, None, None)
        cls.tmp.cleanup()

    def bench(self, *args, expect_rc=0):
        """bench-serve --multi-turn with --save-detailed: (its --result-json, its stdout)."""
        out = os.path.join(self.tmp.name, "result.json")
        p = subprocess.run([BINARY, "bench-serve", "--multi-turn", "--no-progress", "--save-detailed",
                            "--result-json", out, *map(str, args)],
                           capture_output=True, text=True, timeout=120 * time_scale())
        self.assertEqual(p.returncode, expect_rc, p.stderr)
        with open(out) as f:
            return json.load(f), p.stdout

    def test_turns_rotate_between_replicas_and_each_prompt_holds_the_answer_before_it(self):
        endpoints = [s.http_base for s in self.servers]
        result, table = self.bench("--endpoint", ",".join(endpoints), "--turn-routing", "rotate", "--num-sessions", 3,
                                   "--turns", 3, "--max-tokens", 8, "--ignore-eos", "--user-words", 12, "--seed", 5)
        self.assertEqual(result["completed"], 9, result["errors"])
        self.assertEqual(result["multi_turn"]["sessions_completed"], 3)
        self.assertEqual(result["multi_turn"]["sessions_failed"], 0)
        self.assertIn("rotate over 2 endpoints", table)
        sessions = by_session(result)
        self.assertEqual(sorted(sessions), ["s5-0", "s5-1", "s5-2"])
        for sid, turns in sessions.items():
            s = turns[0]["session"]
            self.assertEqual([t["turn"] for t in turns], [0, 1, 2], sid)
            # Turn t of session s on endpoint (s + t) mod 2: each turn on the other replica.
            self.assertEqual([t["endpoint"] for t in turns], [endpoints[(s + t) % 2] for t in range(3)], sid)
            for before, now in zip(turns, turns[1:]):
                self.assertEqual(before["output_tokens"], 8)
                # The history, the answer received and 12 new words: longer by more than the answer.
                self.assertGreater(now["prompt_tokens"], before["prompt_tokens"] + before["output_tokens"], sid)
            # Turn 1's replica has never seen the conversation; turn 2's served its turn 0.
            self.assertEqual(turns[1]["cached_tokens"], 0, sid)
            self.assertGreaterEqual(turns[2]["cached_tokens"], 16, sid)
            # Each answer names the replica behind its endpoint.
            self.assertEqual([t["replica"] for t in turns], [f"mt-{(s + t) % 2}" for t in range(3)], sid)
        # Per replica: sessions 0 and 2 start on mt-0, session 1 on mt-1 (5 turns and 4); every
        # session's answers came from both.
        self.assertEqual(result["replicas"], {"mt-0": {"requests": 5, "ok": 5, "rejected": 0, "failed": 0, "sessions": 2},
                                              "mt-1": {"requests": 4, "ok": 4, "rejected": 0, "failed": 0, "sessions": 1}})
        self.assertEqual(result["requests_without_replica"], 0)
        self.assertEqual(result["sessions_moved"], 3)
        self.assertEqual(result["failed_by_error"], {})
        self.assertIn("Sessions moved between replicas:         3", table)
        per_turn = result["per_turn"]
        self.assertEqual([t["completed"] for t in per_turn], [3, 3, 3])
        prompts = [t["mean_prompt_tokens"] for t in per_turn]
        self.assertEqual(prompts, sorted(prompts))
        self.assertGreater(per_turn[2]["p90_ttft_ms"], 0)

    def test_grpc_conversations_stay_on_their_replica_and_reuse_its_prefix_cache(self):
        endpoints = [f"grpc://{s.grpc_target}" for s in self.servers]
        result, _ = self.bench("--endpoint", ",".join(endpoints), "--num-sessions", 4, "--turns", 3, "--max-tokens", 8,
                               "--user-words", 12, "--session-concurrency", 2)
        self.assertEqual(result["completed"], 12, result["errors"])
        self.assertEqual(result["multi_turn"]["turn_routing"], "session")
        sessions = by_session(result)
        for sid, turns in sessions.items():
            self.assertEqual(len({t["endpoint"] for t in turns}), 1, sid)
            self.assertEqual(len({t["replica"] for t in turns}), 1, sid)
            for before, now in zip(turns, turns[1:]):
                self.assertGreater(now["prompt_tokens"], before["prompt_tokens"], sid)
                # The turn before it, sent to the same replica, fills at least one block of 16.
                self.assertGreaterEqual(now["cached_tokens"], 16, sid)
        self.assertEqual(result["sessions_moved"], 0)
        firsts = {r: sum(1 for turns in sessions.values() if turns[0]["replica"] == r) for r in ("mt-0", "mt-1")}
        self.assertEqual({r: c["sessions"] for r, c in result["replicas"].items()}, {r: n for r, n in firsts.items() if n})
        self.assertEqual(sum(c["requests"] for c in result["replicas"].values()), 12)

    def test_the_id_and_the_whole_history_reach_the_endpoint(self):
        fake = FakeEndpoint()
        try:
            users = os.path.join(self.tmp.name, "users.jsonl")
            with open(users, "w") as f:
                f.write('"Tell me a story."\n{"content": "Make it longer."}\n{"prompt": "And then?"}\n')
            result, _ = self.bench("--endpoint", fake.endpoint, "--num-sessions", 2, "--turns", 3, "--seed", 7,
                                   "--system-prompt", "Be brief.", "--user-messages", users, "--max-tokens", 5)
        finally:
            fake.close()
        self.assertEqual(result["completed"], 6, result["errors"])
        lines = ["Tell me a story.", "Make it longer.", "And then?"]
        sent = defaultdict(list)
        for sid, body in fake.requests:
            sent[sid].append(body)
            self.assertEqual(body["stream"], True)
            self.assertEqual(body["stream_options"], {"include_usage": True})
            self.assertEqual(body["max_tokens"], 5)
        self.assertEqual(sorted(sent), ["s7-0", "s7-1"])  # the X-Session-Id header of every turn
        for s, sid in enumerate(["s7-0", "s7-1"]):
            turns = sorted(sent[sid], key=lambda b: len(b["messages"]))
            self.assertEqual(len(turns), 3)
            want = [{"role": "system", "content": "Be brief."}]
            for t, body in enumerate(turns):
                want.append({"role": "user", "content": lines[(s * 3 + t) % 3]})
                self.assertEqual(body["messages"], want, f"{sid} turn {t}")
                want.append({"role": "assistant", "content": f"answer to {len(want)} messages"})
        for r in result["requests"]:  # usage read from the stream's last chunk
            n = 2 + 2 * r["turn"]
            self.assertEqual((r["prompt_tokens"], r["cached_tokens"], r["output_tokens"]), (10 * n, 2 * n, 2))
            self.assertEqual(r["replica"], "")  # this endpoint names none
        self.assertNotIn("replicas", result)
        self.assertNotIn("sessions_moved", result)

    def test_a_failing_endpoint_ends_only_the_conversations_on_it(self):
        fake = FakeEndpoint(fail=True)
        try:
            live = self.servers[0].http_base
            endpoints = ",".join([live, fake.endpoint])
            result, _ = self.bench("--endpoint", endpoints, "--num-sessions", 6, "--turns", 2, "--max-tokens", 4)
            rotated, _ = self.bench("--endpoint", endpoints, "--num-sessions", 4, "--turns", 3, "--max-tokens", 4,
                                    "--turn-routing", "rotate")
        finally:
            fake.close()
        sessions = by_session(result)
        down = [sid for sid, turns in sessions.items() if turns[0]["endpoint"] == fake.endpoint]
        up = [sid for sid in sessions if sid not in down]
        self.assertTrue(down and up, sessions)  # six ids spread over both
        for sid in down:
            self.assertEqual([(t["turn"], t["outcome"]) for t in sessions[sid]], [(0, "failed")])
            self.assertIn("HTTP 500: replica down", sessions[sid][0]["error"])
        for sid in up:
            self.assertEqual([(t["turn"], t["outcome"]) for t in sessions[sid]], [(0, "ok"), (1, "ok")])
        self.assertEqual(result["multi_turn"]["sessions_failed"], len(down))
        self.assertEqual(result["multi_turn"]["sessions_completed"], len(up))
        self.assertEqual(result["failed"], len(down))
        # The live replica answered the sessions that started there; the failures, which named no
        # replica, are counted by cause.
        self.assertEqual(result["replicas"], {"mt-0": {"requests": 2 * len(up), "ok": 2 * len(up), "rejected": 0,
                                                       "failed": 0, "sessions": len(up)}})
        self.assertEqual(result["requests_without_replica"], len(down))
        self.assertEqual(result["failed_by_error"], {"HTTP 500: replica down": len(down)})
        # Rotating, every conversation reaches the failing replica: at turn 0 (odd ones) or turn 1.
        for sid, turns in by_session(rotated).items():
            outcomes = [t["outcome"] for t in turns]
            self.assertEqual(outcomes, ["failed"] if turns[0]["session"] % 2 else ["ok", "failed"], sid)
        self.assertEqual(rotated["multi_turn"]["sessions_failed"], 4)
        self.assertEqual(rotated["completed"], 2)

    def test_help_names_every_flag(self):
        text = subprocess.run([BINARY, "bench-serve", "--help"], capture_output=True, text=True, check=True).stdout
        for flag in ("--multi-turn", "--num-sessions", "--turns", "--session-concurrency", "--think-time-s",
                     "--user-messages", "--user-words", "--system-prompt", "--max-tokens", "--ignore-eos",
                     "--turn-routing", "X-Session-Id"):
            self.assertIn(flag, text)


if __name__ == "__main__":
    unittest.main()
