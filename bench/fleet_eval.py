#!/usr/bin/env python3
"""A fleet behind nginx (scripts/fleet.sh, deploy/nginx/nginx.conf.template): three `specula serve`
replicas of stories260K, each with OMP_NUM_THREADS=1, a redis-server and nginx, all on loopback.

  affinity  200 sessions of 5 turns (bench-serve --multi-turn, X-Session-Id / x-session-id) through
            nginx, over HTTP and over gRPC: whether every turn of a session landed on one replica
            (the replica's X-Specula-Replica header, checked against nginx's access log), and each
            replica's share of the sessions against an even share (goal: 0.6x to 1.4x).
  canary    Two stable replicas of stories260K and a canary replica of another model (the TinyStories
            draft, so another weights hash: another version), nginx's split_clients at --canary-weight
            (default 10%): --sessions sessions (default 1,000) of --turns turns with distinct session
            ids, over HTTP and gRPC. Each version's share of the sessions (goal: 10% +- 3 points),
            whether every turn of a session landed on one version, and the replicas' own metrics
            summed by their model_version label against the turns each version answered.
  chaos     The fleet's capacity first (bench-serve, all requests at once, through nginx); then a
            base rate at 50% of it, a 5x burst for 10 s, and kill -9 of one replica mid-run. Counts
            completed, refused (429 / RESOURCE_EXHAUSTED) and failed requests, which failures were
            in flight on the killed replica, how long nginx kept sending to it (its access log's
            $upstream_addr), how many requests a retry on another replica recovered, and whether
            the survivors hold any KV block for a sequence afterwards. --surface http|grpc.

Prints markdown tables and a JSON summary; exits 1 when a goal fails.

  python3 bench/fleet_eval.py affinity|chaos [--surface http|grpc|both] [--binary build/release/specula]
"""
import argparse
import collections
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FLEET = os.path.join(ROOT, "scripts", "fleet.sh")
sys.path.insert(0, os.path.join(ROOT, "tests/serving/python"))
import serving_util  # noqa: E402

MODELS = os.path.join(ROOT, "models", "tinystories")
MODEL = os.path.join(MODELS, "stories260K.bin")
TOKENIZER = os.path.join(MODELS, "tok512.bin")


class Fleet:
    """scripts/fleet.sh up/down around a `with` block; `env` holds fleet.env's values."""

    def __init__(self, binary, n=3, serve_flags=(), max_fails=2, fail_timeout_s=5, canary=()):
        self.dir = tempfile.mkdtemp(prefix="specula-fleet-eval-")
        template = serving_util.plain_chat_template(self.dir)  # stories260K has none: each message on a line
        base = serving_util.free_port_block(2 * (n + (1 if canary else 0)) + 2)
        self.cmd = ["bash", FLEET, "up", str(n), "--model", MODEL, "--dir", self.dir, "--specula", binary,
                    "--http-port", str(base), "--grpc-port", str(base + 1), "--base-port", str(base + 2),
                    "--max-fails", str(max_fails), "--fail-timeout-s", str(fail_timeout_s), *canary,
                    "--", "--tokenizer", TOKENIZER, "--chat-template", template, *serve_flags]
        self.n = n

    def __enter__(self):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(self.cmd, check=True, env=env)
        self.env = dict(line.strip().split("=", 1) for line in open(os.path.join(self.dir, "fleet.env")) if "=" in line)
        return self

    def __exit__(self, *exc):
        subprocess.run(["bash", FLEET, "down", "--dir", self.dir], check=False)

    def replica_http(self, i):
        return self.env[f"REPLICA_{i}_HTTP"]

    def replica_addr(self, i, surface):
        return self.env[f"REPLICA_{i}_{'GRPC' if surface == 'grpc' else 'HTTP'}"]

    def pid(self, name):
        return int(open(os.path.join(self.dir, f"{name}.pid")).read().strip())

    def endpoint(self, surface):
        return f"{surface}://{self.env['GRPC' if surface == 'grpc' else 'HTTP']}"

    def access_log(self):
        with open(os.path.join(self.dir, "access.log")) as f:
            f.seek(getattr(self, "log_from", 0))
            return [json.loads(line) for line in f if line.strip()]

    def mark_access_log(self):
        """From now on access_log() returns only the lines written after this call."""
        self.log_from = os.path.getsize(os.path.join(self.dir, "access.log"))


def bench(binary, endpoint, args, label):
    out = os.path.join(tempfile.mkdtemp(prefix="fleet-bench-"), f"{label}.json")
    cmd = [binary, "bench-serve", "--endpoint", endpoint, "--no-progress", "--save-detailed", "--result-json", out, *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench-serve failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


# ---- affinity

def affinity(binary, fleet, surface, sessions, turns, seed):
    fleet.mark_access_log()
    res = bench(binary, fleet.endpoint(surface),
                ["--multi-turn", "--num-sessions", str(sessions), "--turns", str(turns), "--session-concurrency", "8",
                 "--max-tokens", "16", "--user-words", "8", "--seed", str(seed)], f"affinity-{surface}")
    by = collections.defaultdict(list)
    for r in res["requests"]:
        by[r["session_id"]].append(r)
    failed = sum(r["outcome"] != "ok" for r in res["requests"])
    moved = sum(len({r["replica"] for r in rs if r["outcome"] == "ok"}) > 1 for rs in by.values())
    first = collections.Counter(min(rs, key=lambda r: r["turn"])["replica"] for rs in by.values())
    even = sessions / fleet.n
    shares = {f"replica-{i}": first.get(f"replica-{i}", 0) / even for i in range(fleet.n)}
    # nginx's own view: the replicas each session's requests went to.
    seen = collections.defaultdict(set)
    for line in fleet.access_log():
        if line["session"]:
            seen[line["session"]].add(line["upstream"])
    moved_log = sum(len(v) > 1 for v in seen.values())
    ok = failed == 0 and moved == 0 and moved_log == 0 and all(0.6 <= s <= 1.4 for s in shares.values())
    return {"surface": surface, "seed": seed, "sessions": len(by), "turns": turns, "requests": len(res["requests"]), "failed": failed,
            "sessions_moved": moved, "sessions_moved_in_access_log": moved_log, "access_log_sessions": len(seen),
            "sessions_per_replica": dict(sorted(first.items())), "share_of_even": shares, "ok": ok}


def print_affinity(rows):
    print("\n| surface | seed | sessions x turns | failed | sessions on >1 replica (header / nginx log) | "
          "sessions per replica | share of an even split |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        per = ", ".join(f"{k} {v}" for k, v in r["sessions_per_replica"].items())
        share = ", ".join(f"{v:.2f}x" for v in r["share_of_even"].values())
        print(f"| {r['surface']} | {r['seed']} | {r['sessions']} x {r['turns']} | {r['failed']} | {r['sessions_moved']} / "
              f"{r['sessions_moved_in_access_log']} | {per} | {share} |")


# ---- canary

def version_metrics(fleet):
    """Each replica's /metrics summed by model_version: {version: requests finished}."""
    from prometheus_client.parser import text_string_to_metric_families
    import urllib.request
    out = collections.Counter()
    for i in range(int(fleet.env["REPLICAS"])):
        text = urllib.request.urlopen(f"http://{fleet.replica_http(i)}/metrics", timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for smp in family.samples:
                if smp.name == "specula:request_success_total":
                    out[smp.labels["model_version"]] += int(smp.value)
    return out


def canary(binary, fleet, surface, sessions, turns, weight, stable_model_version, seed):
    before = version_metrics(fleet)
    res = bench(binary, fleet.endpoint(surface),
                ["--multi-turn", "--num-sessions", str(sessions), "--turns", str(turns), "--session-concurrency", "16",
                 "--max-tokens", "4", "--user-words", "4", "--seed", str(seed)], f"canary-{surface}")
    after = version_metrics(fleet)
    by = collections.defaultdict(list)
    for r in res["requests"]:
        by[r["session_id"]].append(r)
    failed = sum(r["outcome"] != "ok" for r in res["requests"])
    versions = {sid: {r["model_version"] for r in rs if r["outcome"] == "ok"} for sid, rs in by.items()}
    mixed = sum(len(v) > 1 for v in versions.values())
    per_version = collections.Counter(next(iter(v)) for v in versions.values() if len(v) == 1)
    canary_sessions = sum(n for v, n in per_version.items() if v != stable_model_version)
    share = 100.0 * canary_sessions / max(len(by), 1)
    turns_by_version = collections.Counter(r["model_version"] for r in res["requests"] if r["outcome"] == "ok")
    metrics_by_version = {v: after[v] - before.get(v, 0) for v in after}
    ok = failed == 0 and mixed == 0 and abs(share - weight) <= 3 and dict(turns_by_version) == {
        v: n for v, n in metrics_by_version.items() if n}
    return {"surface": surface, "seed": seed, "sessions": len(by), "turns": turns, "failed": failed,
            "sessions_on_two_versions": mixed,
            "sessions_per_version": dict(per_version), "canary_share_pct": round(share, 1),
            "turns_per_version": dict(turns_by_version), "metrics_requests_per_version": metrics_by_version, "ok": ok}


def print_canary(rows, weight):
    print(f"\n| surface | seed | sessions x turns | canary weight | failed | sessions on two versions | sessions per version | "
          "canary's share | turns per version (bench-serve) | requests per version (replicas' metrics) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = lambda d: ", ".join(f"`{k}` {v}" for k, v in sorted(d.items()))  # noqa: E731
        print(f"| {r['surface']} | {r['seed']} | {r['sessions']} x {r['turns']} | {weight}% | {r['failed']} | "
              f"{r['sessions_on_two_versions']} | {fmt(r['sessions_per_version'])} | {r['canary_share_pct']}% | "
              f"{fmt(r['turns_per_version'])} | {fmt(r['metrics_requests_per_version'])} |")


# ---- chaos

def schedule_requests(res):
    """bench-serve's detailed arrays as one dict per request."""
    keys = {"send_times": "send_s", "e2els": "e2e_s", "outcomes": "outcome", "request_errors": "error",
            "request_replicas": "replica"}
    n = len(res["outcomes"])
    return [{v: res[k][i] for k, v in keys.items() if k in res} for i in range(n)]


def kill_at(pid, delay_s, box):
    time.sleep(delay_s)
    box["t"] = time.time()
    os.kill(pid, signal.SIGKILL)


def nginx_view(log, addr, t_kill, fail_timeout_s, surface):
    """How nginx treated the killed replica (addr) from its access log: attempts after the kill (a
    request's start is its end less request_time), and the requests a second try recovered."""
    mine = [l for l in log if ("Generate" in l["uri"]) == (surface == "grpc")]
    attempts = sorted(l["t"] - l["request_time"] for l in mine
                      if addr in l["upstream"].split(", ") and l["t"] - l["request_time"] >= t_kill)
    first_window = [a for a in attempts if a < t_kill + fail_timeout_s]
    in_flight = [l for l in mine if l["upstream"].split(", ")[-1] == addr and l["t"] - l["request_time"] < t_kill <= l["t"]]
    retried = [l for l in mine if "," in l["upstream"]]
    good = (lambda l: l["grpc_status"] == "0") if surface == "grpc" else (lambda l: l["status"] == 200)
    return {"in_flight_at_kill": len(in_flight), "attempts_after_kill": len(attempts), "attempts_in_first_window": len(first_window),
            "last_attempt_ms_after_kill": round((first_window[-1] - t_kill) * 1000, 1) if first_window else None,
            "later_probes_s_after_kill": [round(a - t_kill, 2) for a in attempts[len(first_window):]],
            "retried": len(retried), "retried_recovered": sum(good(l) for l in retried),
            "retried_statuses": dict(collections.Counter(l["upstream_status"] for l in retried))}


def phases(reqs, args):
    """Outcomes by when each request was sent: before, during and after the burst, and after the kill."""
    burst_end = args.burst_start_s + args.burst_s
    cuts = sorted({0.0, args.burst_start_s, burst_end, args.kill_at_s, float("inf")})
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        name = ("burst" if args.burst_start_s <= lo < burst_end else "base") + (", killed" if lo >= args.kill_at_s else "")
        rs = [r for r in reqs if lo <= r["send_s"] < hi]
        span = f"[{lo:g}, {hi:g}) s" if hi < float("inf") else f"[{lo:g} s, end)"
        out.append({"phase": f"{name} {span}", "sent": len(rs),
                    **{k: sum(r["outcome"] == k for r in rs) for k in ("ok", "rejected", "failed")}})
    return out


def chaos(binary, surface, args):
    flags = ["--max-queue-len", str(args.max_queue_len)]
    with Fleet(binary, 3, flags, max_fails=args.max_fails, fail_timeout_s=args.fail_timeout_s) as fleet:
        ep = fleet.endpoint(surface)
        shape = ["--input-len", "64", "--output-len", str(args.output_len)]
        cap = bench(binary, ep, ["--num-prompts", "600", "--max-concurrency", "96", *shape], "capacity")
        capacity = cap["request_throughput"]
        rate = args.base_fraction * capacity
        n = int(rate * args.duration_s + rate * (args.burst - 1) * args.burst_s)
        fleet.mark_access_log()
        victim = 1
        box = {}
        killer = threading.Thread(target=kill_at, args=(fleet.pid(f"replica-{victim}"), args.kill_at_s, box))
        killer.start()
        res = bench(binary, ep, ["--num-prompts", str(n), "--request-rate", f"{rate:.2f}", "--burst-factor",
                                 str(args.burst), "--burst-start-s", str(args.burst_start_s), "--burst-duration-s",
                                 str(args.burst_s), "--seed", "3", *shape], f"chaos-{surface}")
        killer.join()
        time.sleep(1.0)
        survivors = {f"replica-{i}": serving_util.metrics(f"http://{fleet.replica_http(i)}") for i in range(3)
                     if i != victim}
        log = fleet.access_log()
    reqs = schedule_requests(res)
    killed = f"replica-{victim}"
    failed = [r for r in reqs if r["outcome"] == "failed"]
    on_victim = [r for r in failed if r.get("replica") == killed]
    # A call that died on the killed replica before its first byte names no replica: nginx answered
    # 502 for it (over gRPC, nginx cannot resend a call whose body has gone out). Such failures are
    # counted against the 5xx lines that nginx logged for the killed replica.
    addr = fleet.replica_addr(victim, surface)
    victim_5xx = [l for l in log if l["status"] >= 500 and l["upstream"].split(", ")[-1] == addr]
    unnamed = [r for r in failed if not r.get("replica")]
    before_first_byte = unnamed if len(unnamed) <= len(victim_5xx) else []
    other = [r for r in failed if r.get("replica") != killed and not any(r is u for u in before_first_byte)]
    view = nginx_view(log, addr, box["t"], args.fail_timeout_s, surface)
    metric = serving_util.metric
    held = {k: {"kv_cache_usage_perc": metric(m, "specula:kv_cache_usage_perc"),
                "running": metric(m, "specula:num_requests_running"),
                "waiting": metric(m, "specula:num_requests_waiting")} for k, m in survivors.items()}
    ok = not other and all(h["kv_cache_usage_perc"] == 0 and h["running"] == 0 for h in held.values())
    return {"surface": surface, "capacity_req_s": round(capacity, 1), "base_rate": round(rate, 1), "requests": len(reqs),
            "completed": sum(r["outcome"] == "ok" for r in reqs), "refused": sum(r["outcome"] == "rejected" for r in reqs),
            "failed": len(failed), "failed_in_flight_on_killed": len(on_victim) + len(before_first_byte),
            "failed_on_killed_before_first_byte": len(before_first_byte), "nginx_5xx_from_killed": len(victim_5xx),
            "failed_elsewhere": len(other),
            "failed_elsewhere_errors": dict(collections.Counter(r["error"][:120] for r in other).most_common(8)),
            "failed_on_killed_errors": dict(collections.Counter(r["error"][:120] for r in on_victim + before_first_byte)),
            "phases": phases(reqs, args), "per_replica": res.get("replicas"), "nginx": view, "survivors": held, "ok": ok}


def print_chaos(rows):
    print("\n| surface | capacity req/s | base req/s | requests | completed | refused | failed on the killed "
          "replica | failed elsewhere | nginx stopped sending after | retries recovered | survivors' held blocks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        v = r["nginx"]
        held = ", ".join(f"{h['kv_cache_usage_perc']:.0%}" for h in r["survivors"].values())
        print(f"| {r['surface']} | {r['capacity_req_s']} | {r['base_rate']} | {r['requests']} | {r['completed']} | "
              f"{r['refused']} | {r['failed_in_flight_on_killed']} | {r['failed_elsewhere']} | "
              f"{v['last_attempt_ms_after_kill']} ms ({v['attempts_in_first_window']} tries) | "
              f"{v['retried_recovered']} of {v['retried']} | {held} |")
    for r in rows:
        print(f"\n{r['surface']}: | phase | sent | completed | refused | failed |\n|---|---|---|---|---|")
        for p in r["phases"]:
            print(f"| {p['phase']} | {p['sent']} | {p['ok']} | {p['rejected']} | {p['failed']} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["affinity", "canary", "chaos"])
    ap.add_argument("--surface", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "release", "specula"))
    ap.add_argument("--sessions", type=int, default=None, help="affinity 200, canary 1000")
    ap.add_argument("--canary-weight", type=float, default=10)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[7],
                    help="affinity: session ids s<seed>-<i>, one run per seed")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--base-fraction", type=float, default=0.5)
    ap.add_argument("--burst", type=float, default=5.0)
    ap.add_argument("--burst-start-s", type=float, default=8.0)
    ap.add_argument("--burst-s", type=float, default=10.0)
    ap.add_argument("--kill-at-s", type=float, default=22.0)
    ap.add_argument("--duration-s", type=float, default=32.0)
    ap.add_argument("--max-queue-len", type=int, default=32)
    ap.add_argument("--max-fails", type=int, default=2)
    ap.add_argument("--fail-timeout-s", type=int, default=5)
    args = ap.parse_args()
    surfaces = ["http", "grpc"] if args.surface == "both" else [args.surface]
    print(f"machine: {serving_util.machine()}; {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC")
    if args.what == "affinity":
        with Fleet(args.binary, 3) as fleet:
            rows = [affinity(args.binary, fleet, s, args.sessions or 200, args.turns, seed)
                    for seed in args.seeds for s in surfaces]
        print_affinity(rows)
    elif args.what == "canary":
        draft = os.path.join(MODELS, "stories260K-draft.bin")
        with Fleet(args.binary, 2, canary=("--canary-model", draft, "--canary-weight", f"{args.canary_weight:g}")) as fleet:
            import urllib.request
            stable = urllib.request.urlopen(f"http://{fleet.replica_http(0)}/v1/models", timeout=10)
            stable = json.load(stable)["data"][0]["version"]
            rows = [canary(args.binary, fleet, s, args.sessions or 1000, min(args.turns, 3), args.canary_weight, stable,
                           seed) for seed in args.seeds for s in surfaces]
        print_canary(rows, args.canary_weight)
    else:
        rows = [chaos(args.binary, s, args) for s in surfaces]
        print_chaos(rows)
    print(json.dumps(rows, indent=1))
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
