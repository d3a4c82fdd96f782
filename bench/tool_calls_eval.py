#!/usr/bin/env python3
"""Tool calls on SmolLM2-135M-Instruct Q4_1 through a real `specula serve` with the shipped Hermes-style
template and the official openai client: for each tool_choice (required, a named function, auto), each
question of a customer-service bank, streamed and not, temperature 0.7 with a seed per request.

Counts per choice: requests; outputs that ended by their grammar with calls, every call's name among
the tools and its arguments parsing and validating against the function's parameters (jsonschema);
outputs in plain text; outputs cut by max_tokens (the model went on calling: its last call is
unfinished, the ones before it are counted); and anything else (a finished call that does not
validate, text holding a stray <tool_call>). Exits 1 on anything else.

  python3 bench/tool_calls_eval.py [--per-choice 24] [--binary build/release/specula]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import jsonschema
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "serving", "python"))
import serving_util  # noqa: E402
from test_tool_calls import SMOLLM2, TEMPLATE, TOOLS  # noqa: E402

PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = ["Where is my order AB-1234?", "My blender arrived broken, please have someone call me.",
             "What are your opening hours?", "Can you check order ZX-9081 and tell me when it ships?",
             "I was charged twice for order QA-5521, open a ticket please.", "Hi! Who are you?",
             "Track GB-0042 for me.", "The app keeps crashing when I pay; this is urgent."]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "open_ticket"}}, "auto": "auto"}


def valid(name, arguments):
    try:
        jsonschema.validate(json.loads(arguments), PARAMS[name])
        return True
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False


def ask(client, model, question, choice, seed, stream):
    """(calls as [(name, arguments)], text, finish_reason)."""
    kw = dict(model=model, messages=[{"role": "user", "content": question}], tools=TOOLS, tool_choice=choice,
              max_tokens=256, temperature=0.7, seed=seed)
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        m = c.message
        return [(t.function.name, t.function.arguments) for t in m.tool_calls or []], m.content or "", c.finish_reason
    calls, text, finish = {}, "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta
        finish = chunk.choices[0].finish_reason or finish
        text += d.content or ""
        for c in d.tool_calls or []:
            e = calls.setdefault(c.index, ["", ""])
            e[0] = c.function.name or e[0]
            e[1] += c.function.arguments or ""
    return [tuple(calls[i]) for i in sorted(calls)], text, finish


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-choice", type=int, default=24)
    p.add_argument("--binary", default=serving_util.BINARY)
    args = p.parse_args()
    serving_util.BINARY = args.binary
    rows, bad = [], 0
    with serving_util.Serve("--chat-template", TEMPLATE, model=SMOLLM2, tokenizer=None) as serve:
        client = openai.OpenAI(base_url=serve.http_base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        for name, choice in CHOICES.items():
            n = with_calls = good_calls = calls_total = text_only = cut = other = 0
            for i in range(args.per_choice):
                calls, text, finish = ask(client, model, QUESTIONS[i % len(QUESTIONS)], choice, 100 + i,
                                          stream=i % 2 == 1)
                n += 1
                if finish == "length":  # its last call is unfinished
                    cut += 1
                    calls = calls[:-1]
                ok = [valid(c, a) and (name != "named" or c == "open_ticket") for c, a in calls]
                calls_total += len(calls)
                good_calls += sum(ok)
                if not all(ok):
                    other += 1
                elif finish == "tool_calls" and calls:
                    with_calls += 1
                elif finish in ("stop", "length") and name == "auto" and "<tool_call>" not in text:
                    text_only += 1
                elif finish != "length":
                    other += 1
            bad += other
            rows.append((name, n, with_calls, f"{good_calls}/{calls_total}", text_only, cut, other))
        assert serve.stop() == 0, serve.stderr()
    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if l.startswith("Model name:")), "unknown")
    print(f"machine: {cpu}, {os.cpu_count()} CPUs; date: {datetime.date.today()}; "
          f"model: {os.path.basename(SMOLLM2)}; half of each row streamed\n")
    print("| tool_choice | requests | ended with valid calls | calls valid / calls | text only | cut by max_tokens "
          "| other |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    print("\nPASS" if bad == 0 else f"\nFAIL: {bad} outputs neither valid calls nor (auto) text")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
