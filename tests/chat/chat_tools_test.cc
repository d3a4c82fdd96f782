// Tool calls on the chat side: a messages file's tool_calls, tool_call_id and name are read (errors
// name the element and the field), reach the template in the shape apply_chat_template gives them
// (arguments parsed into a mapping, tools as OpenAI's function objects), and the shipped Hermes-style
// SmolLM2 template renders them; without tools it renders as the GGUF's own template.
#include <string>
#include <vector>

#include "chat/chat.h"
#include "chat/chat_template.h"
#include "core/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula {
namespace {

std::string ShippedTemplate() {
  auto text = ReadTextFile(std::string(SPECULA_SOURCE_DIR) + "/models/chat_templates/smollm2_tools.jinja");
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// Prints what a template sees of each message and of the tools.
constexpr char kEcho[] =
    "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ tools | tojson }}";

std::string Echo(const std::vector<ChatMessage>& messages, const std::vector<ChatTool>& tools) {
  auto t = ChatTemplate::Parse(kEcho);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  auto out = t->Render(messages, tools, false, "", "");
  return out.ok() ? *out : "ERROR: " + std::string(out.status().message());
}

TEST(ChatToolsTest, ParseMessagesJsonReadsToolFields) {
  auto m = ParseMessagesJson(R"([
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"b\": 1, \"a\": [2]}"}},
        {"function": {"name": "now", "arguments": {"z": true, "y": null}}},
        {"function": {"name": "ping"}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get", "content": "sunny"}])",
                             "msgs.json");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3u);
  const ChatMessage& a = (*m)[1];
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.tool_calls.size(), 3u);
  EXPECT_EQ(a.tool_calls[0].id, "call_1");
  EXPECT_EQ(a.tool_calls[0].name, "get");
  EXPECT_EQ(a.tool_calls[0].arguments, R"({"b": 1, "a": [2]})");  // the text as sent
  EXPECT_EQ(a.tool_calls[1].arguments, R"({"z":true,"y":null})");  // JSON given: in its order
  EXPECT_EQ(a.tool_calls[2].arguments, "");
  EXPECT_EQ((*m)[2].tool_call_id, "call_1");
  EXPECT_EQ((*m)[2].name, "get");
  EXPECT_EQ((*m)[2].content, "sunny");
  EXPECT_TRUE((*m)[0].tool_calls.empty());
}

TEST(ChatToolsTest, ParseMessagesJsonNamesElementAndField) {
  struct Case {
    std::string json, error;
  };
  const std::vector<Case> cases = {
      {R"([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
       "m.json: message 1: field 'tool_calls[0].function.name' must be a string"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}, {"function": {"name": "g", "arguments": "{no"}}]}])",
       "m.json: message 0: field 'tool_calls[1].function.arguments' must be JSON text"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}])",
       "m.json: message 0: field 'tool_calls[0].function.arguments' must be a string or an object"},
      {R"([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}])",
       "m.json: message 0: field 'tool_calls[0].type' must be \"function\""},
      {R"([{"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f"}}]}])",
       "m.json: message 0: field 'tool_calls[0].id' must be a string"},
      {R"([{"role": "assistant", "tool_calls": [{"name": "f"}]}])",
       "m.json: message 0: field 'tool_calls[0].function' must be an object"},
      {R"([{"role": "assistant", "tool_calls": {"function": {"name": "f"}}}])",
       "m.json: message 0: field 'tool_calls' must be a list"},
      {R"([{"role": "tool", "content": "1", "tool_call_id": 5}])",
       "m.json: message 0: field 'tool_call_id' must be a string"},
      {R"([{"role": "tool", "content": "1", "name": ["f"]}])", "m.json: message 0: field 'name' must be a string"},
      // Only calls excuse a null content.
      {R"([{"role": "assistant", "content": null}])", "m.json: message 0: field 'content' must be a string"},
      {R"([{"content": "x"}])", "m.json: message 0: field 'role' must be a string"},
  };
  for (const Case& c : cases) {
    auto m = ParseMessagesJson(c.json, "m.json");
    ASSERT_FALSE(m.ok()) << c.json;
    EXPECT_EQ(m.status().message(), c.error);
  }
}

TEST(ChatToolsTest, TemplateSeesApplyChatTemplatesShapes) {
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"call_9", "get", R"({"city": "Zürich", "days": [1, 2]})"}, {"", "ping", ""}};
  ChatMessage result{"tool", "22"};
  result.tool_call_id = "call_9";
  result.name = "get";
  const std::vector<ChatTool> tools = {
      {"get", "Weather \"now\".", R"({"type": "object", "properties": {"city": {"type": "string"}}})"},
      {"ping", "", ""}};
  EXPECT_EQ(Echo({{"user", "Hi"}, call, result}, tools),
            "{\"role\": \"user\", \"content\": \"Hi\"}\n"
            "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
            "{\"id\": \"call_9\", \"type\": \"function\", \"function\": {\"name\": \"get\", "
            "\"arguments\": {\"city\": \"Zürich\", \"days\": [1, 2]}}}, "
            "{\"id\": \"\", \"type\": \"function\", \"function\": {\"name\": \"ping\", \"arguments\": {}}}]}\n"
            "{\"role\": \"tool\", \"content\": \"22\", \"tool_call_id\": \"call_9\", \"name\": \"get\"}\n"
            "[{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": \"Weather \\\"now\\\".\", "
            "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}, "
            "{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]");
  // No tools: None, as apply_chat_template passes it.
  EXPECT_EQ(Echo({{"user", "Hi"}}, {}), "{\"role\": \"user\", \"content\": \"Hi\"}\nnull");
}

TEST(ChatToolsTest, RenderNamesJsonThatDoesNotParse) {
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"a", "f", "{}"}, {"b", "g", "{oops"}};
  EXPECT_EQ(Echo({{"user", "Hi"}, call}, {}), "ERROR: messages[1].tool_calls[1].function.arguments: not JSON");
  EXPECT_EQ(Echo({{"user", "Hi"}}, {{"f", "", "{}"}, {"g", "", "[1,"}}),
            "ERROR: tools[1].function.parameters: not JSON");
}

TEST(ChatToolsTest, ShippedSmolLm2TemplateRendersHermesToolCalls) {
  ChatSource source{ShippedTemplate(), "", "<|im_end|>", "smollm2_tools.jinja"};
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}, {"call_2", "get_time", ""}};
  std::vector<ChatMessage> messages = {{"user", "Weather and time?"}, call, {"tool", "18"}, {"tool", "\"14:05\""}};
  messages[2].tool_call_id = "call_1";
  const std::vector<ChatTool> tools = {{"get_weather", "The weather.", R"({"type":"object"})"}, {"get_time", "", ""}};
  auto out = RenderChat(source, messages, tools);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n"
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather.\", "
            "\"parameters\": {\"type\": \"object\"}}}\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather and time?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n18\n</tool_response>\n<tool_response>\n\"14:05\"\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // A system message replaces the default prompt in the tools' turn, and is not repeated.
  messages.insert(messages.begin(), ChatMessage{"system", "Be terse."});
  out = RenderChat(source, messages, tools);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->rfind("<|im_start|>system\nBe terse.\n\n# Tools\n", 0), 0u) << *out;
  EXPECT_EQ(out->find("<|im_start|>system", 1), std::string::npos) << *out;
  EXPECT_EQ(out->find("SmolLM"), std::string::npos) << *out;
  EXPECT_EQ(out->find("Qwen"), std::string::npos) << *out;
}

TEST(ChatToolsTest, ShippedSmolLm2TemplateWithoutToolsIsTheGgufs) {
  auto gguf = FindChatTemplate(testing::SmolLm2Gguf());
  ASSERT_TRUE(gguf.ok()) << gguf.status() << " (scripts/fetch_models.sh fetches the model)";
  ChatSource ours = *gguf;
  ours.template_text = ShippedTemplate();
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "What is 2+2?"}},
      {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}},
      {{"user", "Hi"}, {"assistant", "  Hello  "}, {"user", "\n\nwhitespace\t"}},
      {{"assistant", "I start."}, {"user", "ok"}},
      {{"system", "Only a system prompt."}},
  };
  for (const auto& messages : conversations) {
    auto want = RenderChat(*gguf, messages);
    auto got = RenderChat(ours, messages);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *want);
  }
}

}  // namespace
}  // namespace specula
