#!/usr/bin/env python3
"""Chat templates: the C++ renderer (chat/chat_template.h) against Python jinja2, byte for byte.

The reference is the environment transformers' apply_chat_template builds
(transformers/utils/chat_template_utils.py, _compile_jinja_template):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None, separators=None,
                                   sort_keys=False)
    globals: raise_exception (raises TemplateError), strftime_now (datetime.now().strftime)

and the variables it passes: messages, tools=None, documents=None, add_generation_prompt, the
special tokens. strftime_now is fixed to NOW here (the C++ side gets the same time).

Every real template in tests/data/chat_templates, and those models/chat_templates ships, is
rendered for a set of conversations, with and without add_generation_prompt, and with tool calls
where the template takes them; then a corpus of small templates exercises each construct of the
subset. Where jinja2 raises, the C++ renderer must fail too (with the same message for
raise_exception()). Tool conversations also go in OpenAI's wire shape (arguments as JSON text)
through the C++ side's own conversion, against jinja2 given what apply_chat_template takes.

    test_chat_template.py PATH/TO/chat_template_render   (or SPECULA_CHAT_TEMPLATE_RENDER=...)
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile
import unittest
import warnings
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# jinja2 decodes string literals with Python's unicode-escape, which warns on unknown escapes ('\q',
# kept as written): the feature corpus has one on purpose.
warnings.filterwarnings("ignore", category=DeprecationWarning, module="jinja2")

RENDER = os.environ.get("SPECULA_CHAT_TEMPLATE_RENDER", "")
TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat_templates"
SHIPPED = Path(__file__).resolve().parents[3] / "models" / "chat_templates"
NOW = 1725541620  # 2024-09-05 13:07 UTC: what strftime_now() formats on both sides


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} tag, minus its index tracking: it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def py_render(case):
    """(True, text) or (False, error) from jinja2."""
    try:
        template = ENV.from_string(case["template"])
        if "variables" in case:
            return True, template.render(**case["variables"])
        if "wire_messages" in case:
            return True, template.render(
                messages=[hf_message(m) for m in case["wire_messages"]],
                tools=case.get("wire_tools") or None, documents=None,
                add_generation_prompt=case["add_generation_prompt"], bos_token=case["bos_token"],
                eos_token=case["eos_token"], **case.get("extra", {}))
        return True, template.render(messages=case["messages"], tools=None, documents=None,
                                     add_generation_prompt=case["add_generation_prompt"],
                                     bos_token=case["bos_token"], eos_token=case["eos_token"],
                                     **case.get("extra", {}))
    except Exception as e:  # any failure: the C++ side must fail too
        return False, f"{type(e).__name__}: {e}"


def hf_message(wire):
    """A wire message as apply_chat_template takes it (vLLM's conversion): each call's arguments
    parsed ("" as {}), a null content as ""."""
    m = {"role": wire["role"], "content": wire.get("content") or ""}
    if wire.get("tool_calls"):
        m["tool_calls"] = [{"id": c.get("id", ""), "type": "function", "function": {
            "name": c["function"]["name"],
            "arguments": json.loads(c["function"].get("arguments") or "{}")}}
            for c in wire["tool_calls"]]
    for key in ("tool_call_id", "name"):
        if key in wire:
            m[key] = wire[key]
    return m


def cpp_render(cases):
    """[(ok, text or error)] from one run of the C++ renderer in batch mode."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump([dict(c, now=NOW) for c in cases], f, ensure_ascii=False)
        path = f.name
    try:
        out = subprocess.run([RENDER, path], capture_output=True, check=True, timeout=300)
    finally:
        os.unlink(path)
    results = json.loads(out.stdout.decode("utf-8"))
    return [(r["ok"], r["output"] if r["ok"] else r["error"]) for r in results]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}

CONVERSATIONS = {
    "system_user": [SYSTEM, user("Hello!")],
    "user_only": [user("What is 2+2?")],
    "multi_turn": [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke."),
                   assistant("Why did the chicken cross the road?"), user("Why?")],
    "system_multi_turn": [SYSTEM, user("Hi"), assistant("Hello."), user("Bye")],
    "unicode": [user("Héllo wörld — 你好, 世界! 🌍🚀 ß İ ǆ Ω\u00a0nbsp\u2028sep"),
                assistant("Ça va? 👍"), user("日本語のテキスト")],
    "quotes": [user("He said \"hi\" and 'bye' \\ back\\slash <b>&amp;</b> {{ not a tag }} "
                    "{% raw %} #} \\n"),
               assistant("'single' \"double\" `back`"), user("{'json': [1, \"two\"]}")],
    "whitespace": [{"role": "system", "content": "  padded system prompt  \n"},
                   user("\n\n  leading and trailing newlines  \n\n"), assistant("\ttabbed\t"),
                   user("line1\r\nline2\n\u3000")],
    "empty_content": [user("")],
    "system_only": [SYSTEM],
    "assistant_last": [user("Hi"), assistant("Hello there  ")],
    "consecutive_users": [user("first"), user("second")],
    "assistant_first": [assistant("I start."), user("ok")],
    "tool_role": [user("What is 6*7?"), {"role": "tool", "content": "42"}],
    "no_messages": [],
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get the current temperature at a location, in \"°C\" by default <&>.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "As \"City, Country\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "precision": {"type": "integer", "minimum": 0, "default": 1},
            },
            "required": ["location"],
        },
        "return": {"type": "number", "description": "The temperature, 1.5e-3 precise"},
    },
}]

TOOL_CALL = {"id": "call12345", "type": "function",
             "function": {"name": "get_current_temperature",
                          "arguments": {"location": "Paris, France", "unit": "celsius"}}}

TOOL_CHAT = [
    SYSTEM, user("What's the temperature in Paris?"),
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_current_temperature",
     "content": "22.5"},
    assistant("It is 22.5 °C in Paris."), user("Thanks! And in Zürich?"),
]

TOOL_TEMPLATES = ["llama3_1.jinja", "llama3_2.jinja", "qwen2_5.jinja", "mistral_v0_3.jinja",
                  "qwen3.jinja", "smollm3.jinja"]


WIRE_TOOLS = [
    {"type": "function", "function": {k: v for k, v in TOOLS[0]["function"].items() if k != "return"}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now, \"HH:MM\"."}},
    {"type": "function", "function": {"name": "ping"}},
]


def wire_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Tool conversations in OpenAI's wire shape: arguments as JSON text, content null beside calls.
WIRE_CHATS = {
    "one_call": [
        SYSTEM, user("What's the temperature in Paris?"),
        {"role": "assistant", "content": None, "tool_calls": [wire_call(
            "call12345", "get_current_temperature",
            '{"location": "Paris, France", "unit": "celsius", "nested": {"z": [1, 2.5, null]}}')]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_current_temperature",
         "content": "22.5"},
        assistant("It is 22.5 °C in Paris."), user("Thanks! And in Zürich?"),
    ],
    "parallel_calls": [
        user("Time and temperature in Zürich?"),
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            wire_call("call00001", "get_current_temperature", '{"location":"Zürich"}'),
            wire_call("call00002", "get_time", "")]},
        {"role": "tool", "tool_call_id": "call00001", "content": "18"},
        {"role": "tool", "tool_call_id": "call00002", "content": "\"14:05\""},
    ],
    "no_system": [user("ping it"), {"role": "assistant", "content": "", "tool_calls": [
        wire_call("call00003", "ping", "{}")]}, {"role": "tool", "content": "pong"}],
}


def template_files():
    files = sorted(TEMPLATES.glob("*.jinja"))
    assert len(files) >= 5, f"expected the chat templates in {TEMPLATES}"
    shipped = sorted(SHIPPED.glob("*.jinja"))
    assert shipped, f"expected the shipped chat templates in {SHIPPED}"
    return files + shipped


def plain_case(template, messages, add_generation_prompt, **kw):
    return dict({"template": template, "messages": messages,
                 "add_generation_prompt": add_generation_prompt, "bos_token": "<s>",
                 "eos_token": "</s>"}, **kw)


def variables_case(template, **variables):
    return {"template": template, "variables": dict(
        {"tools": None, "documents": None, "add_generation_prompt": True,
         "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, **variables)}


class Parity:
    """Renders cases on both sides and compares them."""

    def check(self, named_cases, min_rendered=1, min_raised=0):
        names = [n for n, _ in named_cases]
        cases = [c for _, c in named_cases]
        got = cpp_render(cases)
        self.assertEqual(len(got), len(cases))
        rendered = raised = 0
        for name, case, (cpp_ok, cpp_out) in zip(names, cases, got):
            py_ok, py_out = py_render(case)
            with self.subTest(case=name):
                if py_ok:
                    rendered += 1
                    self.assertTrue(cpp_ok, f"jinja2 rendered {py_out!r}; C++ failed: {cpp_out}")
                    self.assertEqual(cpp_out, py_out)
                else:
                    raised += 1
                    self.assertFalse(cpp_ok, f"jinja2 raised {py_out}; C++ rendered {cpp_out!r}")
                    if py_out.startswith("TemplateError: "):  # raise_exception(): same message
                        self.assertIn(py_out[len("TemplateError: "):], cpp_out)
        self.assertGreaterEqual(rendered, min_rendered)
        self.assertGreaterEqual(raised, min_raised)
        return rendered, raised


class RealTemplates(Parity, unittest.TestCase):
    def test_conversations(self):
        cases = []
        for path in template_files():
            text = path.read_text(encoding="utf-8")
            for conv, messages in CONVERSATIONS.items():
                for agp in (False, True):
                    cases.append((f"{path.name}/{conv}/agp={agp}", plain_case(text, messages, agp)))
        # Every template renders most conversations; Mistral's role checks and the Llama templates'
        # messages[0] on an empty list raise in jinja2 and must fail here too.
        self.check(cases, min_rendered=len(cases) // 2, min_raised=10)

    def test_tool_calls(self):
        cases = []
        for name in TOOL_TEMPLATES:
            text = (TEMPLATES / name).read_text(encoding="utf-8")
            cases.append((f"{name}/tools", variables_case(text, messages=TOOL_CHAT, tools=TOOLS)))
            cases.append((f"{name}/tools_no_gen", variables_case(
                text, messages=TOOL_CHAT[:4], tools=TOOLS, add_generation_prompt=False)))
            cases.append((f"{name}/tools_in_system", variables_case(
                text, messages=TOOL_CHAT, tools=TOOLS, tools_in_user_message=False)))
            cases.append((f"{name}/two_tools", variables_case(
                text, messages=[user("Both?")], tools=TOOLS + [dict(TOOLS[0], function=dict(
                    TOOLS[0]["function"], name="other", description="Ünïcode\n\ttool"))])))
        llama31 = (TEMPLATES / "llama3_1.jinja").read_text(encoding="utf-8")
        search = {"id": "call00001", "type": "function",
                  "function": {"name": "brave_search", "arguments": {"query": "weather \"Paris\""}}}
        cases.append(("llama3_1.jinja/builtin_tools", variables_case(
            llama31, builtin_tools=["brave_search", "code_interpreter", "wolfram_alpha"],
            messages=[user("Search it"), {"role": "assistant", "content": "",
                                          "tool_calls": [search]},
                      {"role": "ipython", "content": {"results": ["sunny", 21]}}])))
        cases.append(("llama3_1.jinja/two_tool_calls_raise", variables_case(
            llama31, messages=[user("x"), {"role": "assistant", "content": "",
                                           "tool_calls": [TOOL_CALL, TOOL_CALL]}])))
        cases.append(("mistral_v0_3.jinja/bad_call_id_raises", variables_case(
            (TEMPLATES / "mistral_v0_3.jinja").read_text(encoding="utf-8"),
            messages=[user("x"), {"role": "assistant", "content": "",
                                  "tool_calls": [dict(TOOL_CALL, id="short")]}])))
        self.check(cases, min_rendered=len(TOOL_TEMPLATES) * 4, min_raised=2)

    def test_wire_tool_chats(self):
        # The chat side's conversion (ParseMessagesJson, ChatTemplate::Render with tools) gives the
        # templates what apply_chat_template gives them.
        cases = []
        for path in [TEMPLATES / n for n in TOOL_TEMPLATES] + sorted(SHIPPED.glob("*.jinja")):
            text = path.read_text(encoding="utf-8")
            for conv, messages in WIRE_CHATS.items():
                for tools in (WIRE_TOOLS, []):
                    cases.append((f"{path.name}/{conv}/tools={len(tools)}", dict(
                        plain_case(text, None, True, wire_messages=messages, wire_tools=tools),
                        messages=None)))
        self.check(cases, min_rendered=len(cases) // 2)

    def test_smollm2_tools_without_tools_is_smollm2(self):
        # The shipped tool template renders plain conversations as SmolLM2's own (the GGUF's
        # tokenizer.chat_template, tests/data/chat_templates/smollm2.jinja) does.
        ours = (SHIPPED / "smollm2_tools.jinja").read_text(encoding="utf-8")
        theirs = (TEMPLATES / "smollm2.jinja").read_text(encoding="utf-8")
        names, cases = [], []
        for conv, messages in CONVERSATIONS.items():
            if any(m["role"] == "tool" for m in messages):
                continue  # ours renders tool results as Hermes <tool_response> blocks
            for agp in (False, True):
                names.append(f"{conv}/agp={agp}")
                cases.append(plain_case(ours, messages, agp))
        self.assertGreaterEqual(len(cases), 20)
        for name, case, (ok, out) in zip(names, cases, cpp_render(cases)):
            with self.subTest(case=name):
                py_ok, want = py_render(dict(case, template=theirs))
                self.assertTrue(py_ok, want)
                self.assertTrue(ok, out)
                self.assertEqual(out, want)

    def test_extra_variables(self):
        cases = []
        for name in ("llama3_1.jinja", "llama3_2.jinja"):
            text = (TEMPLATES / name).read_text(encoding="utf-8")
            cases.append((f"{name}/date_string", plain_case(
                text, CONVERSATIONS["system_user"], True, extra={"date_string": "01 Jan 2025"})))
        self.check(cases, min_rendered=2)
        # The date reaches the prompt: a fixed strftime_now() when no date_string is given.
        ok, out = cpp_render([plain_case((TEMPLATES / "llama3_2.jinja").read_text(encoding="utf-8"),
                                         CONVERSATIONS["user_only"], True)])[0]
        self.assertTrue(ok, out)
        self.assertIn("Today Date: 05 Sep 2024", out)

    def test_single_case_interface(self):
        # The brief's interface: one case per file, the rendering on stdout, errors with status 1.
        smollm2 = (TEMPLATES / "smollm2.jinja").read_text(encoding="utf-8")
        mistral = (TEMPLATES / "mistral_v0_1.jinja").read_text(encoding="utf-8")
        for case, want_ok in ((plain_case(smollm2, CONVERSATIONS["user_only"], True), True),
                              (plain_case(mistral, CONVERSATIONS["consecutive_users"], False), False)):
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(case, f)
            try:
                r = subprocess.run([RENDER, f.name], capture_output=True, timeout=60)
            finally:
                os.unlink(f.name)
            py_ok, py_out = py_render(case)
            self.assertEqual(py_ok, want_ok)
            if want_ok:
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.decode("utf-8"), py_out)
            else:
                self.assertEqual(r.returncode, 1)
                self.assertIn("Conversation roles must alternate user/assistant/user/assistant/...",
                              r.stderr.decode("utf-8"))


# Small templates, each on its own: (name, template, variables). The variables default to a short
# conversation; "x" is never defined.
MSGS = [SYSTEM, user("Hi there"), assistant("  Hello!  "), user("Bye")]
FEATURES = [
    # Whitespace: trim_blocks, lstrip_blocks, -/+ markers, comments, newlines.
    ("lstrip_trim", "  {% if true %}\n  x\n  {% endif %}\nend\n", {}),
    ("lstrip_not_after_text", "a  {% if true %}b{% endif %}  c", {}),
    ("lstrip_after_var", "{{ 1 }}  {% if true %}b{% endif %}", {}),
    ("trim_one_newline", "{% if true %}\n\nx{% endif %}\n\n", {}),
    ("var_no_trim", "  {{ 'x' }}  \n  {# c #}  \ny", {}),
    ("plus_keeps", "  {%+ if true %}x{% endif +%}\ny", {}),
    ("minus_strips", "a \n {%- if true -%} \n x \n {%- endif -%} \n b", {}),
    ("var_minus", "a \n\t {{- ' v ' -}} \n b", {}),
    ("comment_minus", "a  {#- comment -#}  b\n{# multi\nline #}\nc", {}),
    ("crlf", "a\r\n  {% if true %}\r\nb\r\n{% endif %}\r\nc\r\n", {}),
    ("trailing_newlines", "x\n\n", {}),
    ("nbsp_lstrip", "\u00a0 {% if true %}x{% endif %}", {}),
    ("tab_lstrip_line", "a\n\t\t{% for i in range(2) %}\n\t{{ i }}\n\t\t{% endfor %}\nb", {}),
    ("generation_tag", "{% generation %}  body {{ 1 }}\n{% endgeneration %}after", {}),
    # Literals and printing.
    ("literals", "{{ 1 }}|{{ -2 }}|{{ 1.5 }}|{{ 2.0 }}|{{ 1e3 }}|{{ 1_000 }}|{{ 0x1f }}|{{ none }}|{{ True }}|{{ false }}", {}),
    ("floats", "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 123456789.123456789 }} {{ 2.5e-10 }}", {}),
    ("containers", "{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': [1]} }} {{ (1,) }} {{ (1, 'x') }} {{ () }} {{ [] }} {{ {} }}", {}),
    ("string_repr", "{{ ['it\\'s', 'say \"x\"', 'both \\' \"', 'tab\\t nl\\n', 'bs\\\\', 'é 你', '\\x7f\\x01', '\\u200b'] }}", {}),
    ("escapes", "{{ 'a\\nb\\tc\\x41\\u00e9\\U0001F600\\\\ \\q \\101' }}|{{ \"d\\\"q\" }}|{{ 'x' 'y' \"z\" }}", {}),
    ("namespace_print", "{% set ns = namespace(a=1, b='x') %}{{ ns }}", {}),
    # Operators.
    ("arithmetic", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}", {}),
    ("float_arith", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 1 + 1.5 }} {{ true + 1 }} {{ 3 * 1.5 }} {{ 2.0 ** 0.5 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 2 * 3 ~ 4 }} {{ 1 ~ 2 * 3 }} {{ not 1 == 2 }} {{ 'a' ~ (1 + 2) }}", {}),
    ("sequences", "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ [1] + [2, 3] }} {{ 'a' + 'b' }} {{ (1,) + (2,) }} {{ 'ab' * -1 }}", {}),
    ("concat", "{{ 'x' ~ 1 ~ 1.5 ~ none ~ true ~ [1] ~ x ~ {'a': 1} }}", {}),
    ("compare", "{{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 'b' <= 'a' }} {{ (1, 2) == [1, 2] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ none == none }} {{ x == x }} {{ x == none }} {{ 1 != 2 }}", {}),
    ("membership", "{{ 'a' in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }} {{ 'a' in x }} {{ x in [1] }} {{ 1.0 in [1] }}", {}),
    ("logic", "{{ none or 'x' }} {{ 'a' and 'b' }} {{ 0 or [] }} {{ '' and 1 }} {{ not none }} {{ not x }} {{ 1 if true else 2 }} {{ 'a' if false }}|{{ 'y' if none is none else 'n' }} {{ 1 if 0 else 2 if 1 else 3 }}", {}),
    # Variables, attributes and items.
    ("attrs_items", "{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} {{ messages[9] }}|{{ messages[0].missing }}|{{ messages.0.role }} {{ 'abc'[1] }} {{ 'héllo'[1] }} {{ 'abc'[10] }}|{{ none.x }}|{{ 5[0] }}|{{ 'abc'.foo }}", {}),
    ("slices", "{{ messages[1:] | length }} {{ [1,2,3,4][1:-1] }} {{ [1,2,3,4][::2] }} {{ [1,2,3,4][::-1] }} {{ 'héllo'[1:3] }} {{ 'abcdef'[-2:] }} {{ 'abc'[:] }} {{ [1,2,3][5:] }} {{ 'abc'[::-2] }} {{ (1,2,3)[1:] }}", {}),
    ("undefined", "[{{ x }}][{{ x | length }}][{{ x | trim }}][{{ x is defined }}][{{ x is none }}][{{ x is iterable }}][{{ x is string }}][{{ x | default('d') }}][{{ x | list }}][{{ x | join(',') }}][{{ x | string }}][{{ x | upper }}][{{ x | first }}][{{ x | last }}][{{ x ~ 'a' }}][{{ x | items | list }}][{{ [x] }}]", {}),
    ("undefined_loop", "{% for a in x %}{{ a }}{% else %}empty{% endfor %}{% if x %}t{% else %}f{% endif %}", {}),
    # Statements.
    ("loop_vars", "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}[{{ loop.previtem is defined }}{{ (loop.previtem or {}).role }}|{{ (loop.nextitem or {}).role }}]{{ loop.cycle('a', 'b') }};{% endfor %}", {}),
    ("loop_else_filter", "{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in range(6) if i is odd %}{{ loop.index }}:{{ i }}/{{ loop.length }} {% endfor %}", {}),
    ("loop_unpack", "{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}", {}),
    ("loop_controls", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("nested_loops", "{% for a in range(3) %}{% for b in range(a) %}{{ loop.index }}{{ a }}{{ b }},{% endfor %}|{{ loop.index }}{% endfor %}", {}),
    ("range", "{% for i in range(3) %}{{ i }}{% endfor %}|{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}|{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}|{{ range(4) | list }}|{{ range(0) | length }}", {}),
    ("scoping", "{% set count = 0 %}{% for i in range(3) %}{% set count = count + 1 %}{{ count }}{% endfor %}{{ count }}|{% for i in range(3) %}{% if i == 1 %}{% set y = 'set' %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]|{% if true %}{% set z = 1 %}{% endif %}{{ z }}", {}),
    ("shadowing", "{% set x2 = 5 %}{% for i in range(2) %}{{ x2 }}{% set x2 = i %}{{ x2 }}{% endfor %}{{ x2 }}|{% set messages = messages[1:] %}{{ messages | length }}", {}),
    ("namespace", "{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }} {{ ns['n'] }}{% set ns2 = namespace() %}{% set ns2.index = 0 %}{{ ns2.index }}{{ ns2.missing }}", {}),
    ("set_forms", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 'x' %}{{ t }}{% set blk %}  block {{ a }} {% endset %}[{{ blk }}]", {}),
    ("if_chain", "{% for v in [0, 1, 2, none, 'x'] %}{% if v == 0 %}zero{% elif v == 1 %}one{% elif v is none %}none{% elif v is string %}str{% else %}other{% endif %},{% endfor %}", {}),
    # Filters.
    ("filters_str", "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'aBc' | upper }}|{{ 'ÀBÇ' | lower }}|{{ 'hello WORLD' | capitalize }}|{{ 'hello world-foo (bar' | title }}|{{ 'ß' | upper }}|{{ 'aXbX' | replace('X', '-') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'ab' | replace('', '.') }}|{{ 12 | replace(1, 3) }}", {}),
    ("filters_len", "{{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ messages | length }} {{ '' | length }}", {}),
    ("filters_conv", "{{ 3 | string }}{{ none | string }}{{ [1] | string }}|{{ '42' | int + 1 }} {{ ' 7 ' | int }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 4.7 | int }} {{ true | int }} {{ '0x1A' | int(0, 16) }} {{ 'ff' | int(base=16) }} {{ none | int }}|{{ '1.5' | float }} {{ 'x' | float }} {{ 3 | float }} {{ ' 2e3 ' | float }}", {}),
    ("filters_default", "{{ none | default('d') }}|{{ x | default('d') }}|{{ x | d('dd') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ 0 | default(5, boolean=true) }}|{{ x | default }}|", {}),
    ("filters_seq", "{{ [3, 1, 2] | first }} {{ 'abc' | last }} {{ [1, 2, 3] | join(', ') }} {{ [1, 'a', none] | join }} {{ {'a': 1, 'b': 2} | join('-') }} {{ messages | join('|', attribute='role') }} {{ 'abc' | list }} {{ {'k': 1} | list }} {{ [] | first }}|{{ {'x': 1, 'y': 2} | first }}", {}),
    ("filters_items", "{{ {'a': 1, 'b': [2]} | items | list }} {% for k, v in {'z': 1} | items %}{{ k }}{{ v }}{% endfor %}", {}),
    ("filters_select", "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'equalto', 'user') | list | length }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 0, 2] | select | list }} {{ [1, 2, 3] | reject('in', [2]) | list }} {{ ['a', 'code', 'b'] | reject('equalto', 'code') | join(', ') }} {{ [{'r': 1}, {'x': 2}] | selectattr('r', 'defined') | list }} {{ [{'r': 1}, {'r': 0}] | selectattr('r') | list }} {% if [] | select('odd') %}generator-is-true{% endif %}", {}),
    ("filters_map_reverse", "{{ messages | map(attribute='role') | join(',') }}|{{ messages | map(attribute='name', default='anon') | list }}|{{ messages | map(attribute='content') | map('trim') | map('upper') | list }}|{{ ['a', 'b'] | map('replace', 'a', 'z') | join }}|{{ none | map('upper') | list }}|{{ [1, 2, 3] | reverse | list }}|{{ 'héllo' | reverse }}|{{ {'a': 1, 'b': 2} | reverse | list }}|{{ [1, 2] | select('odd') | reverse }}|{% for m in messages | reverse %}{{ m.role[0] }}{% endfor %}|{% if [] | reverse %}iterator-is-true{% endif %}", {}),
    ("tojson", "{{ {'b': 1, 'a': [1, 2.5, none, true, 'x']} | tojson }}|{{ 'é<>&\\'\"\\\\\\n\\x01\\u2028' | tojson }}|{{ [] | tojson }}|{{ {} | tojson(indent=2) }}|{{ (1, 2) | tojson }}|{{ 1e20 | tojson }}|{{ 1e-7 | tojson }}|{{ -0.0 | tojson }}|{{ 'ü' | tojson(ensure_ascii=true) }}|{{ '😀' | tojson(ensure_ascii=true) }}", {}),
    ("tojson_indent", "{{ {'z': {'y': [1, {'x': []}]}, 'a': 2} | tojson(indent=4) }}|{{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ [1, [2]] | tojson(indent=1) }}|{{ {'a': [1, 2]} | tojson(separators=(',', ':')) }}|{{ {'a': 1} | tojson(indent='\\t') }}|{{ messages[0] | tojson }}", {}),
    # Tests.
    ("tests", "{{ 5 is divisibleby 3 }}{{ 6 is divisibleby(3) }}{{ 3 is odd }}{{ 4 is even }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ 1 is number }}{{ true is number }}{{ none is none }}{{ x is undefined }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 'Ab' is lower }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ false is false }}{{ 1 is true }}{{ 1 is sameas 1 }}{{ none is sameas none }}{{ 2 is in [1, 2] }}{{ 3 is eq 3 }}{{ 3 is equalto 4 }}{{ 3 is ne 4 }}{{ 3 is gt 2 }}{{ 3 is ge 3 }}{{ 3 is lt 2 }}{{ 3 is le 3 }}{{ 'a' is sequence }}{{ 1 is sequence }}{{ raise_exception is callable }}{{ strftime_now is defined }}", {}),
    ("tests_not", "{{ x is not defined }} {{ none is not none }} {{ messages is not string }} {{ not x is defined }} {{ messages[0] is mapping and messages[0].role is defined }} {{ x is defined or 'fallback' }}", {}),
    # Methods.
    ("str_methods", "{{ '  a  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'a b  c'.split(' ') }}|{{ ' a b \\n c '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a b c'.split(none, 1) }}|{{ 'Hello World'.upper() }}{{ 'Hello World'.lower() }}|{{ 'hello wORLD-foo bar'.title() }}|{{ 'ǆa'.capitalize() }}|{{ 'aXa'.replace('a', 'b') }}|{{ ', '.join(['a', 'b']) }}|{{ '\\u3000 x\\u00a0'.strip() }}", {}),
    ("dict_methods", "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}{{ messages[0].keys() | list }}{{ messages[0].values() | list }}{{ messages[0].get('role') }}{{ messages[0].get('nope') }}{{ messages[0].get('nope', 'dflt') }}", {}),
    ("strftime", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B') }}", {}),
    # Errors that jinja2 raises too.
    ("err_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("err_undefined_plus", "{{ x + 1 }}", {}),
    ("err_undefined_attr", "{{ x.y }}", {}),
    ("err_undefined_item_chain", "{{ messages[5]['role'] }}", {}),
    ("err_undefined_call", "{{ foo() }}", {}),
    ("err_call_string", "{{ 'a'() }}", {}),
    ("err_div_zero", "{{ 1 / 0 }}", {}),
    ("err_mod_zero", "{{ 1 % 0 }}", {}),
    ("err_len_int", "{{ 5 | length }}", {}),
    ("err_iterate_int", "{% for i in 5 %}{% endfor %}", {}),
    ("err_compare", "{{ 1 < 'a' }}", {}),
    ("err_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("err_tojson_undefined", "{{ x | tojson }}", {}),
    ("err_items_list", "{{ [1] | items | list }}", {}),
    ("err_set_attr", "{% set a = 1 %}{% set a.b = 2 %}", {}),
    ("err_raise", "{{ raise_exception('Custom failure: \"quoted\" é') }}", {}),
    ("err_range_big", "{{ range(200000) | length }}", {}),
    ("err_syntax_unclosed_if", "{% if true %}x", {}),
    ("err_syntax_bad_expr", "{{ 1 + }}", {}),
    ("err_syntax_unknown_tag", "{% frobnicate %}", {}),
    ("err_syntax_endfor", "{% endfor %}", {}),
    ("err_syntax_unterminated", "{{ 'a' ", {}),
    ("err_break_outside", "{% break %}", {}),
    ("err_concat_binds_tighter", "{{ 1 + 2 ~ 3 }}", {}),
    ("err_previtem_first", "{% for m in messages %}{{ loop.previtem.role }}{% endfor %}", {}),
]


class JinjaFeatures(Parity, unittest.TestCase):
    def test_features(self):
        cases = []
        for name, template, variables in FEATURES:
            cases.append((name, variables_case(template, **dict({"messages": MSGS}, **variables))))
        errors = sum(name.startswith(("err_",)) for name, _, _ in FEATURES)
        rendered, raised = self.check(cases, min_rendered=len(cases) - errors, min_raised=errors)
        self.assertEqual(raised, errors)


if __name__ == "__main__":
    for i, arg in enumerate(sys.argv[1:], start=1):
        if not arg.startswith("-"):
            RENDER = sys.argv.pop(i)
            break
    if not RENDER or not os.access(RENDER, os.X_OK):
        sys.exit("usage: test_chat_template.py PATH/TO/chat_template_render")
    unittest.main()
