// Tool calls read from an output (serving/tool_calls.h): ExtractToolCalls on whole outputs, and
// ToolCallStream's events: a call's start once its name is read, its arguments as they come,
// content held back only while it could open a call; and any split of an output into deltas (every
// split point, one byte at a time) gives the calls and content of ExtractToolCalls on the whole.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "serving/tool_calls.h"

namespace specula {
namespace {

using Kind = ToolStreamEvent::Kind;

// What events add up to, in ExtractToolCalls' shape; fails the test on an event out of order.
ParsedToolCalls Assemble(const std::vector<ToolStreamEvent>& events) {
  ParsedToolCalls out;
  for (const ToolStreamEvent& e : events) {
    switch (e.kind) {
      case Kind::kContent:
        EXPECT_FALSE(e.text.empty());
        out.content += e.text;
        break;
      case Kind::kCallStart:
        EXPECT_EQ(e.index, static_cast<int>(out.calls.size()));
        out.calls.push_back({e.id, e.name, ""});
        break;
      case Kind::kArguments:
        EXPECT_FALSE(e.text.empty());
        EXPECT_EQ(e.index + 1, static_cast<int>(out.calls.size())) << "arguments of a call that is not the last started";
        if (e.index >= 0 && e.index < static_cast<int>(out.calls.size())) out.calls[e.index].arguments += e.text;
        break;
    }
  }
  return out;
}

void Append(std::vector<ToolStreamEvent>* all, std::vector<ToolStreamEvent> more) {
  for (ToolStreamEvent& e : more) all->push_back(std::move(e));
}

ParsedToolCalls Streamed(const std::vector<std::string>& deltas) {
  ToolCallStream s("req-7");
  std::vector<ToolStreamEvent> events;
  for (const std::string& d : deltas) Append(&events, s.Feed(d));
  Append(&events, s.Finish());
  return Assemble(events);
}

void ExpectSame(const ParsedToolCalls& got, const ParsedToolCalls& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].id, want.calls[i].id) << what;
    EXPECT_EQ(got.calls[i].name, want.calls[i].name) << what;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].arguments) << what;
  }
}

struct Want {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

// Outputs and what they hold.
const std::vector<std::pair<std::string, Want>>& Outputs() {
  static const auto* outputs = new std::vector<std::pair<std::string, Want>>{
      {"Just text, no calls.", {"Just text, no calls.", {}}},
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       {"", {{"get_weather", "{\"city\": \"Paris\"}"}}}},
      // Text before, two calls with the separator between them and a newline after: dropped.
      {"Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": {}}]}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
       {"Let me check.\n", {{"a", "{\"x\": [1, {\"y\": {}}]}"}, {"b", "{}"}}}},
      // Text after a call stays, with the whitespace before it.
      {"<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}}</tool_call>\n\nDone.",
       {"\n\nDone.", {{"a", "{\"k\": \"v\"}"}}}},
      // Whitespace anywhere in the header; arguments as generated, unicode and escapes kept.
      {"<tool_call>  {  \"name\" :\"f.g-1\" ,\n \"arguments\":\t{\"s\": \"é \\\"}\\\" \\u00e9 </tool\"} \n}\n\n</tool_call>",
       {"", {{"f.g-1", "{\"s\": \"é \\\"}\\\" \\u00e9 </tool\"}"}}}},
      // Keys the other way round: a call, its arguments compact.
      {"<tool_call>\n{\"arguments\": {\"b\": 1, \"a\": [true, null]}, \"name\": \"f\"}\n</tool_call>",
       {"", {{"f", "{\"b\":1,\"a\":[true,null]}"}}}},
      // Blocks that are no call stay in the content, tags and all.
      {"x <tool_call>not json</tool_call> y", {"x <tool_call>not json</tool_call> y", {}}},
      {"<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", {"<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", {}}},
      {"<tool_call>{\"nam\": \"f\"}</tool_call>", {"<tool_call>{\"nam\": \"f\"}</tool_call>", {}}},
      {"<tool_call>{\"name\": \"f\"}</tool_call>", {"<tool_call>{\"name\": \"f\"}</tool_call>", {}}},
      {"a<tool_call>{\"name\": \"f\", \"argu", {"a<tool_call>{\"name\": \"f\", \"argu", {}}},
      // A partial tag at the end, and angle brackets that are no tag.
      {"Hello <tool_", {"Hello <tool_", {}}},
      {"a < b <tool_cal> <<tool_call", {"a < b <tool_cal> <<tool_call", {}}},
      // Cut off inside the arguments: the call ends there.
      {"Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2",
       {"Sure.", {{"f", "{\"a\": [1, 2"}}}},
      {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_", {"", {{"f", "{\"a\": 1}"}}}},
      {"<tool_call>\n{\"name\": \"f\", \"arguments\": ", {"", {{"f", ""}}}},
      // A call, then a block that is none (the whitespace before it dropped), then text.
      {"<tool_call>{\"name\": \"f\", \"arguments\": 7}</tool_call> <tool_call>[]</tool_call>end",
       {"<tool_call>[]</tool_call>end", {{"f", "7"}}}},
  };
  return *outputs;
}

TEST(ExtractToolCallsTest, SplitsCallsFromContent) {
  for (const auto& [text, want] : Outputs()) {
    const ParsedToolCalls got = ExtractToolCalls(text, "req-7");
    EXPECT_EQ(got.content, want.content) << text;
    ASSERT_EQ(got.calls.size(), want.calls.size()) << text;
    for (size_t i = 0; i < want.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].id, ToolCallId("req-7", static_cast<int>(i))) << text;
      EXPECT_EQ(got.calls[i].name, want.calls[i].first) << text;
      EXPECT_EQ(got.calls[i].arguments, want.calls[i].second) << text;
    }
  }
}

TEST(ToolCallStreamTest, EverySplitGivesTheWholeOutputsCalls) {
  for (const auto& [text, want] : Outputs()) {
    const ParsedToolCalls whole = ExtractToolCalls(text, "req-7");
    for (size_t i = 0; i <= text.size(); ++i) {
      ExpectSame(Streamed({text.substr(0, i), text.substr(i)}), whole, text + " split at " + std::to_string(i));
    }
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    ExpectSame(Streamed(bytes), whole, text + " byte by byte");
  }
}

TEST(ToolCallStreamTest, CallStartsOnceNamedThenArgumentsStream) {
  ToolCallStream s("req-1");
  std::vector<ToolStreamEvent> e = s.Feed("I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"argum");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::kContent);
  EXPECT_EQ(e[0].text, "I'll look.\n");
  e = s.Feed("ents\": ");
  EXPECT_TRUE(e.empty());  // the arguments' start is not read yet
  e = s.Feed("{\"city\": \"Pa");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].kind, Kind::kCallStart);
  EXPECT_EQ(e[0].index, 0);
  EXPECT_EQ(e[0].id, ToolCallId("req-1", 0));
  EXPECT_EQ(e[0].name, "get_weather");
  EXPECT_EQ(e[1].kind, Kind::kArguments);
  EXPECT_EQ(e[1].index, 0);
  EXPECT_EQ(e[1].text, "{\"city\": \"Pa");
  // A closing brace waits for what follows it: it may be the call object's.
  e = s.Feed("ris\"}");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "ris\"");
  e = s.Feed("}\n</tool");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::kArguments);
  EXPECT_EQ(e[0].text, "}");
  e = s.Feed("_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].kind, Kind::kCallStart);
  EXPECT_EQ(e[0].index, 1);
  EXPECT_EQ(e[0].name, "get_time");
  EXPECT_EQ(e[1].kind, Kind::kArguments);
  EXPECT_EQ(e[1].index, 1);
  EXPECT_EQ(e[1].text, "{}");
  EXPECT_TRUE(s.Feed("\n").empty());  // whitespace after a call waits
  EXPECT_TRUE(s.Finish().empty());    // and is dropped at the end
  EXPECT_EQ(s.calls(), 2);
}

TEST(ToolCallStreamTest, HoldsBackOnlyWhatCouldOpenACall) {
  ToolCallStream s("r");
  std::vector<ToolStreamEvent> e = s.Feed("Hi <tool_c");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "Hi ");
  e = s.Feed("x and <");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "<tool_cx and ");
  e = s.Finish();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::kContent);
  EXPECT_EQ(e[0].text, "<");
}

TEST(ToolCallStreamTest, OtherBlocksComeWholeWhenClosed) {
  ToolCallStream s("r");
  EXPECT_TRUE(s.Feed("<tool_call>\n{\"arguments\": {\"a\": 1}, ").empty());
  std::vector<ToolStreamEvent> e = s.Feed("\"name\": \"f\"}\n</tool_call>");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].kind, Kind::kCallStart);
  EXPECT_EQ(e[0].name, "f");
  EXPECT_EQ(e[1].text, "{\"a\":1}");
  EXPECT_TRUE(s.Feed("<tool_call>oops").empty());
  e = s.Feed("</tool_call>");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::kContent);
  EXPECT_EQ(e[0].text, "<tool_call>oops</tool_call>");
}

}  // namespace
}  // namespace specula
