// Chat templates: constructs outside the Jinja subset are errors that name the construct and its
// line, runtime errors (raise_exception(), type errors) surface their message, and small templates
// render exactly. Byte-for-byte parity with Python jinja2 on the real templates is
// tests/chat/python/test_chat_template.py.
#include "chat/chat_template.h"

#include <fstream>

#include "core/mapped_file.h"
#include "chat/chat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula {
namespace {

std::string TemplateFile(const std::string& name) {
  auto text = ReadTextFile(testing::TestDataDir() + "/chat_templates/" + name);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

std::vector<ChatMessage> Conversation() {
  return {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
}

// What Render gives, or "ERROR: <message>".
std::string RenderOrError(std::string_view source, const std::vector<ChatMessage>& messages,
                          const std::map<std::string, std::string>& extra = {}) {
  auto t = ChatTemplate::Parse(source);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  auto out = t->Render(messages, /*add_generation_prompt=*/true, "<s>", "</s>", extra);
  return out.ok() ? *out : "ERROR: " + std::string(out.status().message());
}

struct ErrorCase {
  std::string name;
  std::string source;
  std::string error;  // the whole message Parse() gives
};

class ChatTemplateParseErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ChatTemplateParseErrorTest, NamesConstructAndLine) {
  auto t = ChatTemplate::Parse(GetParam().source);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), GetParam().error);
}

INSTANTIATE_TEST_SUITE_P(
    ChatTemplateUnsupported, ChatTemplateParseErrorTest,
    ::testing::Values(
        ErrorCase{"UnknownFilter", "{{ bos_token }}\n\n{{ messages[0].content | wordcount }}",
                  "chat template line 3: unsupported filter 'wordcount'"},
        ErrorCase{"UnknownFilterInDeadBranch", "{% if false %}\n{{ x | batch(2) }}{% endif %}",
                  "chat template line 2: unsupported filter 'batch'"},
        ErrorCase{"MacroTag", "{% for m in messages %}{% endfor %}\n{% macro render(m) %}{% endmacro %}",
                  "chat template line 2: unsupported tag 'macro'"},
        ErrorCase{"CallTag", "{% call foo() %}x{% endcall %}", "chat template line 1: unsupported tag 'call'"},
        ErrorCase{"RawTag", "a\n  {%- raw %}{{ x }}{% endraw %}", "chat template line 2: unsupported tag 'raw'"},
        ErrorCase{"UnknownTag", "{% frobnicate %}", "chat template line 1: unknown tag 'frobnicate'"},
        ErrorCase{"UnknownTest", "{% if x is\n  prime %}{% endif %}", "chat template line 1: unsupported test 'prime'"},
        ErrorCase{"UnterminatedVariable", "ok\n{{ messages", "chat template line 2: unterminated tag: missing '}}'"},
        ErrorCase{"UnterminatedBlock", "{% if true", "chat template line 1: unterminated tag: missing '%}'"},
        ErrorCase{"UnterminatedComment", "a {# note", "chat template line 1: unterminated comment: missing '#}'"},
        ErrorCase{"UnterminatedString", "{{ 'abc }}", "chat template line 1: unterminated string literal"},
        ErrorCase{"BadExpression", "{{ 1 + }}", "chat template line 1: unexpected '}}'"},
        ErrorCase{"UnbalancedBracket", "{{ [1, 2) }}", "chat template line 1: unexpected ')'"},
        ErrorCase{"UnclosedIf", "{% if x %}\nyes", "chat template line 1: '{% if %}' is never closed (expected '{% endif %}')"},
        ErrorCase{"StrayEnd", "x\n{% endfor %}", "chat template line 2: unexpected '{% endfor %}'"},
        ErrorCase{"ElseAfterElse", "{% if x %}{% else %}{% elif y %}{% endif %}", "chat template line 1: unexpected '{% elif %}'"},
        ErrorCase{"BreakOutsideLoop", "{% break %}", "chat template line 1: 'break' outside a for loop"},
        ErrorCase{"RecursiveLoop", "{% for m in messages recursive %}{% endfor %}",
                  "chat template line 1: unsupported recursive for loop"},
        ErrorCase{"StarArgs", "{{ f(*args) }}", "chat template line 1: unsupported *args / **kwargs"}),
    [](const auto& info) { return info.param.name; });

TEST(ChatTemplateTest, RaiseExceptionSurfacesItsMessage) {
  // Mistral's alternation check: two user turns in a row.
  const std::string out = RenderOrError(TemplateFile("mistral_v0_1.jinja"), {{"user", "a"}, {"user", "b"}});
  EXPECT_EQ(out, "ERROR: chat template line 1: raise_exception: Conversation roles must alternate "
                 "user/assistant/user/assistant/...");
  EXPECT_EQ(RenderOrError("\n{{ raise_exception('bad ' ~ messages | length) }}", {}),
            "ERROR: chat template line 2: raise_exception: bad 0");
}

TEST(ChatTemplateTest, RuntimeErrorsNameTheProblem) {
  EXPECT_EQ(RenderOrError("{{ strftime_later('%Y') }}", {}), "ERROR: chat template line 1: 'strftime_later' is undefined");
  EXPECT_EQ(RenderOrError("{{ bos_token + 1 }}", {}),
            "ERROR: chat template line 1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(RenderOrError("{{ messages[0]['role'] }}", {}),
            "ERROR: chat template line 1: list object has no element 0");
  EXPECT_EQ(RenderOrError("{{ nothing.role }}", {}), "ERROR: chat template line 1: 'nothing' is undefined");
  EXPECT_EQ(RenderOrError("{% for i in 5 %}{% endfor %}", {}), "ERROR: chat template line 1: 'int' object is not iterable");
  EXPECT_EQ(RenderOrError("{{ 'x'.zfill(3) }}", {}), "ERROR: chat template line 1: unsupported string method 'zfill'");
  EXPECT_EQ(RenderOrError("{{ range(1000000) | length }}", {}),
            "ERROR: chat template line 1: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
}

// A template (or tool JSON) built to exhaust the stack or memory fails with an error instead.
TEST(ChatTemplateTest, HostileTemplatesFailCleanly) {
  std::string parens = "{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}";
  EXPECT_EQ(RenderOrError(parens, {}), "ERROR: chat template line 1: nested more than 100 levels deep");
  std::string ifs;
  for (int k = 0; k < 150; ++k) ifs += "{% if true %}";
  EXPECT_EQ(RenderOrError(ifs, {}), "ERROR: chat template line 1: nested more than 100 levels deep");
  std::string sum = "{{ 1";
  for (int k = 0; k < 5000; ++k) sum += " + 1";
  EXPECT_EQ(RenderOrError(sum + " }}", {}), "ERROR: chat template line 1: tag longer than 1000 tokens");
  EXPECT_EQ(RenderOrError("{% set ns = namespace(l=[]) %}{% for i in range(500) %}{% set ns.l = [ns.l] %}"
                          "{% endfor %}", {}),
            "ERROR: chat template line 1: values nested more than 100 levels deep");
  EXPECT_EQ(RenderOrError("{% set ns = namespace() %}\n{% set ns.me = [ns] %}{{ ns }}", {}),
            "ERROR: chat template line 2: unsupported: a namespace inside a namespace");
  EXPECT_EQ(RenderOrError("{% set ns = namespace(s='12345678') %}{% for i in range(40) %}"
                          "{% set ns.s = ns.s + ns.s %}{% endfor %}", {}),
            "ERROR: chat template line 1: string longer than 16 MiB");
  EXPECT_EQ(RenderOrError("{{ [0] * 2000000 }}", {}), "ERROR: chat template line 1: repetition result too large");
  auto t = ChatTemplate::Parse("{{ messages }}");
  ASSERT_TRUE(t.ok());
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  auto out = t->RenderJson("{\"messages\": " + deep + "}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "chat template variables: JSON nested more than 100 levels deep");
}

struct RenderCase {
  std::string name;
  std::string source;
  std::string want;
};

class ChatTemplateRenderTest : public ::testing::TestWithParam<RenderCase> {};

TEST_P(ChatTemplateRenderTest, Exact) {
  EXPECT_EQ(RenderOrError(GetParam().source, Conversation()), GetParam().want);
}

INSTANTIATE_TEST_SUITE_P(
    ChatTemplateSubset, ChatTemplateRenderTest,
    ::testing::Values(
        // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
        RenderCase{"TrimAndLstripBlocks", "  {% if true %}\n  x\n  {% endif %}\nend", "  x\nend"},
        RenderCase{"VariablesAreNotStripped", "  {{ 'v' }}  \n  {# c #}  \nz", "  v  \n  \nz"},
        RenderCase{"MinusStripsAllWhitespace", "a \n {%- if true -%} \n x \n {%- endif -%} \n b", "axb"},
        RenderCase{"PlusKeepsIndent", "  {%+ if true %}x{% endif %}", "  x"},
        RenderCase{"OneTrailingNewlineDropped", "x\r\n\r\n", "x\n"},
        RenderCase{"LoopVariables",
                   "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}/{{ loop.length }}"
                   "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %} {% endfor %}",
                   "10/4F 21/4 32/4 43/4L "},
        RenderCase{"LoopElseAndFilter",
                   "{% for m in messages if m.role == 'user' %}{{ m.content }}{{ loop.length }}"
                   "{% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %}",
                   "Hi2Bye2|empty"},
        RenderCase{"NamespaceCarriesOutOfLoop",
                   "{% set ns = namespace(n=0, last='') %}{% set plain = 0 %}"
                   "{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}"
                   "{% set plain = plain + 1 %}{% endfor %}{{ ns.n }} {{ ns.last }} {{ plain }}",
                   "4 user 0"},
        RenderCase{"SliceAndSystemSplit",
                   "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0].content %}"
                   "{% set messages = messages[1:] %}{% endif %}[{{ sys }}]{% for m in messages %}"
                   "{{ m.role[0] | upper }}{% endfor %}",
                   "[Be brief.]UAU"},
        RenderCase{"Operators",
                   "{{ 7 // 2 }} {{ -7 % 3 }} {{ 1 / 4 }} {{ 2 ** 8 }} {{ 'ab' ~ 1 }} {{ 1 if none else 2 }} "
                   "{{ 'u' in 'user' }} {{ 3 not in [1, 2] }} {{ none or 'd' }}",
                   "3 2 0.25 256 ab1 2 True True d"},
        RenderCase{"UndefinedIsEmptyAndFalse",
                   "[{{ missing }}]{{ missing is defined }}{% if not missing %} falsy{% endif %} "
                   "{{ missing | length }}{{ missing | default('d') }}",
                   "[]False falsy 0d"},
        RenderCase{"HfVariables", "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} "
                   "{{ bos_token }}{{ eos_token }}",
                   "True True True <s></s>"},
        RenderCase{"StringMethodsAndFilters",
                   "{{ '  x  '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'ab'.startswith('a') }}|{{ 'hi there'.title() }}"
                   "|{{ ' y ' | trim }}|{{ messages | length }}",
                   "x|['a', 'b']|True|Hi There|y|4"},
        RenderCase{"ToJsonKeepsOrderAndUnicode",
                   "{{ {'z': 'é<&>', 'a': [1, 2.5, none, true]} | tojson }}|{{ {'k': [1]} | tojson(indent=2) }}",
                   "{\"z\": \"é<&>\", \"a\": [1, 2.5, null, true]}|{\n  \"k\": [\n    1\n  ]\n}"},
        RenderCase{"PythonReprOfContainers", "{{ messages[0] }} {{ (1, 'it\\'s') }} {{ [none, 1.0] }}",
                   "{'role': 'system', 'content': 'Be brief.'} (1, \"it's\") [None, 1.0]"}),
    [](const auto& info) { return info.param.name; });

TEST(ChatTemplateTest, SmolLm2RealTemplate) {
  EXPECT_EQ(RenderOrError(TemplateFile("smollm2.jinja"), {{"user", "What is 2+2?"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
            "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama32DateFromStrftimeNowOrDateString) {
  auto t = ChatTemplate::Parse(TemplateFile("llama3_2.jinja"));
  ASSERT_TRUE(t.ok()) << t.status();
  t->set_fixed_time(1725541620);  // 2024-09-05 13:07 UTC
  const std::string head = "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n";
  auto out = t->Render({{"user", "Hi"}}, true, "<s>", "</s>");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->substr(0, head.size() + 25), head + "Today Date: 05 Sep 2024\n\n");
  out = t->Render({{"user", "Hi"}}, true, "<s>", "</s>", {{"date_string", "01 Jan 2025"}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->substr(0, head.size() + 25), head + "Today Date: 01 Jan 2025\n\n");
}

TEST(ChatTemplateTest, RenderJsonTakesToolCalls) {
  auto t = ChatTemplate::Parse(TemplateFile("qwen2_5.jinja"));
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = t->RenderJson(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]}],
    "tools": null, "add_generation_prompt": false})");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n</tool_call><|im_end|>\n");
  EXPECT_FALSE(t->RenderJson("[1, 2]").ok());
  EXPECT_FALSE(t->RenderJson("{not json").ok());
}

TEST(ChatTemplateTest, CopiesRenderTheSame) {
  auto t = ChatTemplate::Parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  ASSERT_TRUE(t.ok());
  const ChatTemplate copy = *t;
  t = ChatTemplate::Parse("other");  // the copy keeps the parsed template alive
  auto out = copy.Render(Conversation(), false, "", "");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "system:Be brief.;user:Hi;assistant:Hello!;user:Bye;");
}

// Found by review while writing fuzz/hf_config_fuzz (which writes tokenizer_config.json), reproduced
// with it: a chat_template list entry whose "name" is not a string made nlohmann's value() throw.
TEST(ChatTemplateTest, TemplateListEntriesOfAnotherShapeAreSkipped) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": "<s>", "chat_template": [
      {"name": 1, "template": "one"}, 7, {"name": "default", "template": "{{ bos_token }}default"}]})";
  auto s = FindChatTemplate(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->template_text, "{{ bos_token }}default");
  EXPECT_EQ(s->bos_token, "<s>");
}

}  // namespace
}  // namespace specula
