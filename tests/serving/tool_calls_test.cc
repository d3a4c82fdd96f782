// OpenAI tool calls (serving/tool_calls.h): the request's tools and tool_choice (and the older
// functions / function_call) with errors naming the field, the structural tag for each choice, and
// the calls read from an output, whole and streamed: any split of an output into deltas gives the
// calls and content ExtractToolCalls gives for the whole of it.
#include "serving/tool_calls.h"

#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::ordered_json;

constexpr char kTools[] = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                  "required": ["city"]}, "strict": true}},
  {"type": "function", "function": {"name": "get_time"}}])";

std::string Error(const absl::StatusOr<ToolRequest>& r) {
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(ParseToolRequestTest, ReadsToolsChoiceAndParallel) {
  auto r = ParseToolRequest(kTools, "", std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].name, "get_weather");
  EXPECT_EQ(r->tools[0].description, "Weather now.");
  // The schema's keys in the order given.
  EXPECT_EQ(r->tools[0].parameters,
            R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]})");
  EXPECT_EQ(r->tools[1].name, "get_time");
  EXPECT_EQ(r->tools[1].description, "");
  EXPECT_EQ(r->tools[1].parameters, "");
  EXPECT_EQ(r->choice, ToolChoice::kAuto);  // tools without a choice: auto
  EXPECT_TRUE(r->parallel);
  EXPECT_FALSE(r->legacy);
  EXPECT_TRUE(r->parses_calls());

  r = ParseToolRequest(kTools, R"("required")", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->choice, ToolChoice::kRequired);
  EXPECT_FALSE(r->parallel);
  r = ParseToolRequest(kTools, R"({"type": "function", "function": {"name": "get_time"}})", true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->choice, ToolChoice::kNamed);
  EXPECT_EQ(r->function, "get_time");
  r = ParseToolRequest(kTools, R"("none")", std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->choice, ToolChoice::kNone);
  EXPECT_EQ(r->tools.size(), 2u);  // the template still lists them
  EXPECT_FALSE(r->parses_calls());
}

TEST(ParseToolRequestTest, AbsentNullAndEmpty) {
  for (const auto& [tools, choice] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"null", "null"}, {"", R"("none")"}, {"[]", ""}, {"[]", R"("auto")"}}) {
    auto r = ParseToolRequest(tools, choice, std::nullopt);
    ASSERT_TRUE(r.ok()) << tools << " " << choice << ": " << r.status();
    EXPECT_TRUE(r->tools.empty());
    EXPECT_EQ(r->choice, ToolChoice::kNone);
  }
}

TEST(ParseToolRequestTest, LegacyFunctionsMapToTools) {
  const std::string functions = R"([{"name": "get_time", "description": "Time."}, {"name": "f2", "parameters": {}}])";
  auto r = ParseToolRequest("", "", true, functions, R"({"name": "f2"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->legacy);
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].description, "Time.");
  EXPECT_EQ(r->tools[1].parameters, "{}");
  EXPECT_EQ(r->choice, ToolChoice::kNamed);
  EXPECT_EQ(r->function, "f2");
  EXPECT_FALSE(r->parallel);  // one function_call per answer
  r = ParseToolRequest("", "", std::nullopt, functions, "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->choice, ToolChoice::kAuto);
  r = ParseToolRequest("", "", std::nullopt, functions, R"("none")");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->choice, ToolChoice::kNone);
}

TEST(ParseToolRequestTest, ErrorsNameTheField) {
  struct Case {
    std::string tools, choice, functions, call, error;
  };
  const std::string f = R"({"type": "function", "function": {"name": "f"}})";
  const std::vector<Case> cases = {
      {"{", "", "", "", "tools: not JSON"},
      {R"({"type": "function"})", "", "", "", "tools: must be a list"},
      {"[" + f + R"(, {"type": "function", "function": {"description": "x"}}])", "", "", "", "tools[1].function.name: missing"},
      {R"([{"type": "code_interpreter"}])", "", "", "", "tools[0].type: only \"function\" is supported"},
      {R"([{"function": {"name": "f"}}])", "", "", "", "tools[0].type: missing"},
      {R"([{"type": "function"}])", "", "", "", "tools[0].function: missing"},
      {R"([7])", "", "", "", "tools[0]: must be an object"},
      {R"([{"type": "function", "function": {"name": 3}}])", "", "", "", "tools[0].function.name: must be a string"},
      {R"([{"type": "function", "function": {"name": "a b"}}])", "", "", "",
       "tools[0].function.name: 'a b' must be 1 to 64 letters, digits, underscores, dashes or dots"},
      {R"([{"type": "function", "function": {"name": "q\""}}])", "", "", "",
       "tools[0].function.name: 'q\"' must be 1 to 64 letters, digits, underscores, dashes or dots"},
      {R"([{"type": "function", "function": {"name": ")" + std::string(65, 'x') + R"("}}])", "", "", "",
       "tools[0].function.name: '" + std::string(65, 'x') + "' must be 1 to 64 letters, digits, underscores, dashes or dots"},
      {"[" + f + "," + f + "]", "", "", "", "tools[1].function.name: 'f' is given twice"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": "{}"}}])", "", "", "",
       "tools[0].function.parameters: must be an object (a JSON Schema)"},
      {R"([{"type": "function", "function": {"name": "f", "description": 1}}])", "", "", "",
       "tools[0].function.description: must be a string"},
      {R"([{"type": "function", "function": {"name": "f", "strict": "yes"}}])", "", "", "",
       "tools[0].function.strict: must be a boolean"},
      {"[" + f + "]", R"({"type": "function", "function": {"name": "x"}})", "", "", "tool_choice: function 'x' is not in tools"},
      {"[" + f + "]", R"("sometimes")", "", "", "tool_choice: 'sometimes' is not one of none, auto, required or a function"},
      {"[" + f + "]", "3", "", "", "tool_choice: must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"},
      {"[" + f + "]", R"({"type": "allowed_tools"})", "", "", "tool_choice.type: only \"function\" is supported"},
      {"[" + f + "]", R"({"type": "function", "function": {}})", "", "", "tool_choice.function.name: missing"},
      {"[" + f + "]", R"({"type": "function"})", "", "", "tool_choice.function: must be {\"name\": ...}"},
      {"", R"("required")", "", "", "tool_choice: \"required\" needs tools"},
      {"", R"("auto")", "", "", "tool_choice: \"auto\" needs tools"},
      {"[]", R"("required")", "", "", "tool_choice: \"required\" needs tools"},
      {"", R"({"type": "function", "function": {"name": "f"}})", "", "", "tool_choice: function 'f' is not in tools"},
      {"", "", R"([{"description": "x"}])", "", "functions[0].name: missing"},
      {"", "", R"([{"name": "f"}])", R"({"name": "g"})", "function_call: function 'g' is not in functions"},
      {"", "", R"([{"name": "f"}])", R"("required")", "function_call: 'required' is not one of none, auto or a function"},
      {"", "", R"([{"name": "f"}])", "[]", "function_call: must be \"none\", \"auto\" or {\"name\": ...}"},
      {"[" + f + "]", "", R"([{"name": "f"}])", "", "functions: give tools or functions, not both"},
      {"[" + f + "]", R"("auto")", "", R"("auto")", "function_call: give tool_choice or function_call, not both"},
      {"[" + f + "]", "", "", R"("auto")", "function_call: goes with functions (tool_choice goes with tools)"},
      {"", R"("auto")", R"([{"name": "f"}])", "", "tool_choice: goes with tools (function_call goes with functions)"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Error(ParseToolRequest(c.tools, c.choice, std::nullopt, c.functions, c.call)), c.error)
        << c.tools << " | " << c.choice << " | " << c.functions << " | " << c.call;
  }
}

json Tag(const std::string& name, json schema) {
  return {{"type", "tag"},
          {"begin", "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": "},
          {"content", {{"type", "json_schema"}, {"json_schema", std::move(schema)}}},
          {"end", "}\n</tool_call>"}};
}

json Format(const ConstraintSpec& spec) {
  EXPECT_EQ(spec.kind, ConstraintSpec::Kind::kStructuralTag);
  EXPECT_EQ(spec.field, "tools");  // the field errors name
  const json j = json::parse(spec.text, nullptr, false);
  EXPECT_EQ(j.value("type", ""), "structural_tag") << spec.text;
  return j.is_object() && j.contains("format") ? j["format"] : json();
}

TEST(ToolConstraintTest, StructuralTagPerChoice) {
  const json weather = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}, "required": ["city"]})");
  const json empty_object = {{"type", "object"}, {"properties", json::object()}};
  const json both = json::array({Tag("get_weather", weather), Tag("get_time", empty_object)});

  auto r = ParseToolRequest(kTools, "", std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Format(ToolConstraint(*r)), (json{{"type", "triggered_tags"}, {"triggers", json::array({"<tool_call>"})},
                                              {"tags", both}, {"at_least_one", false}, {"stop_after_first", false}}));
  r->parallel = false;
  EXPECT_EQ(Format(ToolConstraint(*r))["stop_after_first"], true);

  r = ParseToolRequest(kTools, R"("required")", std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Format(ToolConstraint(*r)), (json{{"type", "tags_with_separator"}, {"tags", both}, {"separator", "\n"},
                                              {"at_least_one", true}, {"stop_after_first", false}}));

  r = ParseToolRequest(kTools, R"({"type": "function", "function": {"name": "get_weather"}})", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Format(ToolConstraint(*r)),
            (json{{"type", "tags_with_separator"}, {"tags", json::array({Tag("get_weather", weather)})},
                  {"separator", "\n"}, {"at_least_one", true}, {"stop_after_first", true}}));

  r = ParseToolRequest(kTools, R"("none")", std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(ToolConstraint(*r).active());

  // The older API: one call, errors naming its own field.
  r = ParseToolRequest("", "", std::nullopt, R"([{"name": "get_time"}])", R"({"name": "get_time"})");
  ASSERT_TRUE(r.ok()) << r.status();
  const ConstraintSpec legacy = ToolConstraint(*r);
  EXPECT_EQ(legacy.field, "functions");
  EXPECT_EQ(json::parse(legacy.text)["format"],
            (json{{"type", "tags_with_separator"}, {"tags", json::array({Tag("get_time", empty_object)})},
                  {"separator", "\n"}, {"at_least_one", true}, {"stop_after_first", true}}));
}

// The tags' text is what the shipped template prints for a call, and reads back as that call.
TEST(ToolConstraintTest, TagsMatchTheTemplatesCalls) {
  auto text = ReadTextFile(std::string(SPECULA_SOURCE_DIR) + "/models/chat_templates/smollm2_tools.jinja");
  ASSERT_TRUE(text.ok()) << text.status();
  auto t = ChatTemplate::Parse(*text);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"x", "get_weather", R"({"city": "Zürich", "days": 2})"}};
  auto prompt = t->Render({{"user", "Hi"}, call}, false, "", "");
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::string turn = "<|im_start|>assistant\n";
  const size_t at = prompt->rfind(turn);
  ASSERT_NE(at, std::string::npos) << *prompt;
  const std::string output = prompt->substr(at + turn.size(), prompt->size() - at - turn.size() - 11);  // less <|im_end|>\n
  auto r = ParseToolRequest(kTools, R"("required")", std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  const json tag = Format(ToolConstraint(*r))["tags"][0];
  EXPECT_EQ(output, tag["begin"].get<std::string>() + R"({"city": "Zürich", "days": 2})" + tag["end"].get<std::string>());
  const ParsedToolCalls parsed = ExtractToolCalls(output, "req-1");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "Zürich", "days": 2})");
  EXPECT_EQ(parsed.content, "");
}

TEST(ToolCallIdTest, CallPrefixAnd24HexDerivedFromRequestAndIndex) {
  const std::string id = ToolCallId("chatcmpl-1", 0);
  ASSERT_EQ(id.size(), 29u);
  EXPECT_EQ(id.substr(0, 5), "call_");
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
  EXPECT_EQ(id, ToolCallId("chatcmpl-1", 0));
  EXPECT_NE(id, ToolCallId("chatcmpl-1", 1));
  EXPECT_NE(id, ToolCallId("chatcmpl-2", 0));
}

}  // namespace
}  // namespace specula
