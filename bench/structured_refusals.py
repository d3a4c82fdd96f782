#!/usr/bin/env python3
"""How fast `specula serve` refuses constraints it cannot enforce or bound, and whether each refusal
names what it refuses. Against a real server (TinyStories, models/tinystories), over HTTP
/v1/completions from one keep-alive connection:

1. A probe: each bad schema, regex, grammar or choice list (unsupported keywords, inputs past the
   compile-time bounds of constrain/limits.h, input that does not parse) is sent once, with a time
   limit. A case whose probe runs out of time is still compiling on the server (compilation cannot
   be cancelled), so the server is restarted before the next case.
2. Rounds: every case the probe saw refused (HTTP 400) is sent again --rounds times, interleaved;
   P50/P99 of these answers' latency, over all cases and per case.
3. Inputs at the bounds (an enum of 256, depth 12, maxItems 64, {1,64}, 128 properties, a 32 KiB
   schema, 256 choices): each must be accepted; its first answer (a compile) and the median of
   --cap-rounds repeats (the compiled constraint cached) are reported.

Bad cases answered 200 are listed as accepted instead of refused (the keyword and bound checks may
not cover them yet), and those still compiling when their probe's time runs out as such; both are
reported, not a crash. Exits 1 when the refusals' P99 is 50 ms or more,
or an answer is neither 200 nor 400; with --strict also when a bad case is accepted, a refusal does
not name its construct, or an input at the bounds is refused.

  python3 bench/structured_refusals.py [--rounds 40] [--binary PATH] [--probe-timeout 30] [--strict]
"""
import argparse
import datetime
import http.client
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests/serving/python"))
import serving_util  # noqa: E402

PROMPT = "Once upon a time"
P99_LIMIT_MS = 50.0


def schema(s):
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": s}}}


def nested(depth):
    s = {"type": "integer"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def grammar_parens(depth):
    return "root ::= " + "(" * depth + '"a"' + ")" * depth + "\n"


def big_schema(target_bytes):
    """An object of a few enum properties, padded to target_bytes of compact JSON by its description."""
    s = {"type": "object", "description": "", "properties": {
        f"field_{i}": {"type": "string", "enum": [f"value_{i}_{j}" for j in range(8)]} for i in range(16)},
        "required": [f"field_{i}" for i in range(16)]}
    pad = target_bytes - len(json.dumps(s, separators=(",", ":")))
    s["description"] = "x" * max(0, pad)
    return s


def bad_cases():
    """(name, request fields, words of which the message must hold one: the construct)."""
    arr = {"type": "array", "items": {"type": "integer"}}
    return [
        ("oneOf", schema({"oneOf": [{"type": "string"}, {"type": "integer"}]}), ["oneOf"]),
        ("not", schema({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}), ["not"]),
        ("if/then/else", schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                 "if": {"required": ["a"]}, "then": {"required": ["a"]}, "else": {}}),
         ["if", "then", "else"]),
        ("uniqueItems", schema({**arr, "uniqueItems": True}), ["uniqueItems"]),
        ("contains", schema({"type": "array", "contains": {"type": "integer"}}), ["contains"]),
        ("minContains", schema({"type": "array", "contains": {"type": "integer"}, "minContains": 2}),
         ["minContains", "contains"]),
        ("multipleOf on a number", schema({"type": "number", "multipleOf": 0.5}), ["multipleOf"]),
        ("format with minLength", schema({"type": "string", "format": "email", "minLength": 5}),
         ["format", "minLength"]),
        ("pattern with maxLength", schema({"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}),
         ["pattern", "maxLength"]),
        ("allOf of two branches", schema({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                                    {"type": "object", "properties": {"b": {"type": "string"}}}]}),
         ["allOf"]),
        ("$ref to a remote URL", schema({"$ref": "https://example.com/schemas/order.json"}), ["$ref", "http"]),
        ("$ref to a missing definition", schema({"$ref": "#/$defs/missing"}), ["$ref", "missing"]),
        ("dependentRequired", schema({"type": "object", "properties": {"a": {"type": "string"},
                                                                       "b": {"type": "string"}},
                                      "dependentRequired": {"a": ["b"]}}), ["dependentRequired"]),
        ("format with a length bound", schema({"type": "string", "format": "date", "maxLength": 12}),
         ["format", "maxLength"]),
        ("depth 40 nesting", schema(nested(40)), ["depth", "nest"]),
        ("enum of 300 values", schema({"enum": [f"v{i}" for i in range(300)]}), ["enum"]),
        ("maxItems 100000", schema({**arr, "maxItems": 100000}), ["maxItems"]),
        ("minItems 100000", schema({**arr, "minItems": 100000}), ["minItems"]),
        ("minLength > maxLength", schema({"type": "string", "minLength": 10, "maxLength": 2}),
         ["minLength", "maxLength"]),
        ("1 MB schema", schema(big_schema(1 << 20)), ["bytes", "size", "large", "long"]),
        ("regex {1,100000}", {"guided_regex": "a{1,100000}"}, ["100000", "repeat", "{"]),
        ("regex backreference", {"guided_regex": "(a)\\1"}, ["backreference", "\\1"]),
        ("regex lookahead", {"guided_regex": "(?=a)a"}, ["lookahead", "(?="]),
        ("grammar with unbalanced parens", {"guided_grammar": 'root ::= ("a" | "b"\n'}, ["(", ")", "paren"]),
        ("grammar without root", {"guided_grammar": 'expr ::= "a" | "b"\n'}, ["root"]),
        ("grammar with an undefined rule", {"guided_grammar": "root ::= item\n"}, ["item"]),
        ("grammar nested 40 deep", {"guided_grammar": grammar_parens(40)}, ["depth", "nest"]),
        ("empty choice list", {"guided_choice": []}, ["choice", "empty"]),
        ("5000 choices", {"guided_choice": [f"c{i}" for i in range(5000)]}, ["choice"]),
        ("two sources at once", {"guided_regex": "a+", "guided_choice": ["a"]}, ["guided_choice", "guided_regex"]),
        ("schema not an object", {"guided_json": "[1, 2]"}, ["guided_json"]),
    ]


def cap_cases():
    """Inputs at the bounds of constrain/limits.h, which must compile."""
    return [
        ("enum of 256", schema({"enum": [f"v{i}" for i in range(256)]})),
        ("12 levels (the root and 11 nested objects)", schema(nested(11))),
        ("maxItems 64", schema({"type": "array", "items": {"type": "integer"}, "maxItems": 64})),
        ("minItems 64", schema({"type": "array", "items": {"enum": [0, 1]}, "minItems": 64, "maxItems": 64})),
        ("maxLength 64", schema({"type": "string", "maxLength": 64})),
        ("128 properties", schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(128)},
                                   "required": [f"p{i}" for i in range(128)]})),
        ("32 KiB schema", schema(big_schema(32 * 1024 - 64))),
        ("regex {1,64}", {"guided_regex": "[a-z]{1,64}"}),
        ("256 choices", {"guided_choice": [f"c{i}" for i in range(256)]}),
        ("grammar nested 12 deep", {"guided_grammar": grammar_parens(12)}),
        # The slowest shapes found within the bounds: rules that repeat rules twice, 16 of them
        # counted ({0,64}) and the rest `*`, up to 64 rules; an anyOf of as many objects as fit.
        ("grammar: 64 doubling rules, 16 counted", {"guided_grammar": doubling_rules(64, 16)}),
        ("anyOf of objects filling 32 KiB", schema(any_of_objects(32 * 1024 - 64))),
    ]


def doubling_rules(rules, counted):
    """root ::= r0, rule k ::= (r(k+1) "," r(k+1)){0,64} | "x" (the first `counted`; then `*`)."""
    lines = ["root ::= r0"]
    for k in range(rules - 2):
        repeat = "{0,64}" if k < counted else "*"
        lines.append(f'r{k} ::= (r{k + 1} "," r{k + 1}){repeat} | "x"')
    lines.append(f"r{rules - 2} ::= [a-z]*")
    return "\n".join(lines) + "\n"


def any_of_objects(max_bytes):
    branches = []
    while len(branches) < 256:
        i = len(branches)
        b = {"type": "object", "properties": {f"p{i}_{j}": {"type": "string", "maxLength": 64} for j in range(2)},
             "required": [f"p{i}_0", f"p{i}_1"]}
        if len(json.dumps({"anyOf": branches + [b]})) > max_bytes:
            break
        branches.append(b)
    return {"anyOf": branches}


class Client:
    """One keep-alive HTTP connection to the server; reconnects after an error or a time-out."""

    def __init__(self, base, timeout):
        self.host, self.port = base.split("//")[1].split(":")
        self.timeout = timeout
        self.conn = None

    def post(self, fields, max_tokens=2):
        """(status, error message or text, seconds); status None: no answer within the time limit."""
        body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, **fields})
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, int(self.port), timeout=self.timeout)
        t0 = time.perf_counter()
        try:
            self.conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = self.conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            self.conn = None
            return None, f"{type(e).__name__}: {e}", time.perf_counter() - t0
        seconds = time.perf_counter() - t0
        try:
            j = json.loads(data)
        except ValueError:
            return r.status, data[:200].decode(errors="replace"), seconds
        if "error" in j:
            return r.status, j["error"].get("message", ""), seconds
        return r.status, j["choices"][0]["text"] if j.get("choices") else "", seconds


def pct(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def machine():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name:")),
                "unknown")


MODEL = None  # --model: a GGUF whose vocabulary the compile times are measured on


def start():
    if MODEL:
        return serving_util.Serve("--served-model-name", "m", model=MODEL, tokenizer=None, ready_timeout=120)
    return serving_util.Serve("--served-model-name", "m", ready_timeout=120)


def probe(args, cases):
    """Each case once; the server restarted after a case that ran out of time. Returns {name: probe}."""
    results = {}
    serve = start()
    try:
        for name, fields, words in cases:
            client = Client(serve.http_base, args.probe_timeout)
            status, message, seconds = client.post(fields)
            results[name] = {"status": status, "message": message, "seconds": seconds,
                             "named": status == 400 and any(w.lower() in message.lower() for w in words)}
            print(f"  probe {name}: {status} in {seconds * 1e3:.1f} ms", file=sys.stderr)
            if status is None:
                serve.proc.kill()
                serve.__exit__(None, None, None)
                serve = start()
    finally:
        serve.__exit__(None, None, None)
    return results


def rounds(serve, cases, n):
    """The refused cases, each sent n times in interleaved rounds. Returns {name: [(status, seconds)]}."""
    client = Client(serve.http_base, 30)
    out = {name: [] for name, _, _ in cases}
    for _ in range(n):
        for name, fields, _ in cases:
            status, _, seconds = client.post(fields)
            out[name].append((status, seconds))
    return out


def caps(serve, cases, n):
    """Each input at the bounds: the first answer (a compile) and n repeats (cached)."""
    client = Client(serve.http_base, 120)
    out = []
    for name, fields in cases:
        status, message, first = client.post(fields)
        again = [client.post(fields)[2] for _ in range(n)] if status == 200 else []
        out.append((name, status, message, first, again))
    return out


def print_refusals(cases, probes, timed):
    print("| case | answer | names it | P50 ms | P99 ms | message |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in cases:
        p = probes[name]
        status = p["status"]
        lat = [s * 1e3 for st, s in timed.get(name, []) if st == 400]
        answer = {400: "400", 200: "**accepted**", None: f"**no answer in {p['seconds']:.0f} s**"}.get(status,
                                                                                                     f"**{status}**")
        msg = p["message"].replace("|", "\\|").replace("\n", " ")
        msg = msg[:160] + ("..." if len(msg) > 160 else "")
        lat_cols = f"{pct(lat, 50):.2f} | {pct(lat, 99):.2f}" if lat else f"{p['seconds'] * 1e3:.1f} (probe) | –"
        print(f"| {name} | {answer} | {'yes' if p['named'] else 'no' if status == 400 else '–'} | {lat_cols} | "
              f"{msg if status != 200 else '(output: ' + msg[:40] + ')'} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--cap-rounds", type=int, default=5)
    p.add_argument("--binary", default=serving_util.BINARY)
    p.add_argument("--model", help="a GGUF to serve instead of TinyStories (its vocabulary sets compile times)")
    p.add_argument("--probe-timeout", type=float, default=30, help="seconds a probe waits for its answer")
    p.add_argument("--strict", action="store_true",
                   help="also fail on accepted bad cases, unnamed constructs, refused inputs at the bounds")
    args = p.parse_args()
    serving_util.BINARY = args.binary
    global MODEL
    MODEL = args.model
    cases = bad_cases()
    print(f"probing {len(cases)} bad cases...", file=sys.stderr)
    probes = probe(args, cases)
    refused = [c for c in cases if probes[c[0]]["status"] == 400]
    with start() as serve:
        print(f"{args.rounds} rounds of {len(refused)} refused cases...", file=sys.stderr)
        timed = rounds(serve, refused, args.rounds)
        at_caps = caps(serve, cap_cases(), args.cap_rounds)
        rc = serve.stop()
    print(f"machine: {machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"date: {datetime.datetime.now().isoformat(timespec='seconds')}; "
          f"server: {os.path.basename(MODEL or serving_util.TARGET)}, HTTP /v1/completions, one keep-alive connection\n")
    print_refusals(cases, probes, timed)
    all_400 = [s * 1e3 for answers in timed.values() for st, s in answers if st == 400]
    other = [(n, st) for n, answers in timed.items() for st, _ in answers if st != 400]
    accepted = [n for n, _, _ in cases if probes[n]["status"] == 200]
    stuck = [n for n, _, _ in cases if probes[n]["status"] is None]
    odd = [(n, probes[n]["status"]) for n, _, _ in cases if probes[n]["status"] not in (200, 400, None)]
    unnamed = [n for n, _, _ in refused if not probes[n]["named"]]
    p50, p99 = pct(all_400, 50), pct(all_400, 99)
    print(f"\nrefused {len(refused)}/{len(cases)} cases; {len(all_400)} refusals timed: P50 {p50:.2f} ms, "
          f"P99 {p99:.2f} ms, max {max(all_400, default=float('nan')):.2f} ms (limit: P99 < {P99_LIMIT_MS:.0f} ms)")
    print(f"accepted instead of refused ({len(accepted)}): {', '.join(accepted) or 'none'}")
    print(f"no answer within {args.probe_timeout:.0f} s, still compiling ({len(stuck)}): {', '.join(stuck) or 'none'}")
    print(f"refusals that do not name the construct ({len(unnamed)}): {', '.join(unnamed) or 'none'}")
    if odd or other:
        print(f"answers neither 200 nor 400: {odd + other}")
    print("\n| at the bounds | answer | first ms (compiles) | median ms of repeats |\n|---|---|---|---|")
    cap_refused = []
    for name, status, message, first, again in at_caps:
        if status != 200:
            cap_refused.append(name)
        med = f"{statistics.median(again) * 1e3:.2f}" if again else "–"
        answer = status if status == 200 else f"**{status}**: {message[:120]}"
        print(f"| {name} | {answer} | {first * 1e3:.1f} | {med} |")
    failed = []
    if not all_400 or p99 >= P99_LIMIT_MS:
        failed.append(f"refusals' P99 {p99:.2f} ms >= {P99_LIMIT_MS:.0f} ms" if all_400 else "no refusal timed")
    if odd or other or rc != 0:
        failed.append("answers neither 200 nor 400" if odd or other else f"specula serve exited {rc}")
    if args.strict and (accepted or stuck or unnamed or cap_refused):
        failed.append("strict: accepted bad cases, unnamed refusals or refused inputs at the bounds")
    print("\nFAIL: " + "; ".join(failed) if failed else "\nPASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
