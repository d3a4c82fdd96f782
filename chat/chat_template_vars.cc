// Chat templates: the variables of a render as template values (messages with their tool calls,
// tools, or a JSON object given as is), and ChatTemplate's Render and RenderJson.
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "chat/chat_template.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace jinja {
namespace {

// JSON (insertion order kept, as Python's json.loads does) to a template value.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int depth = 0) {
  if (depth > kMaxNesting) {
    return absl::InvalidArgumentError("chat template variables: JSON nested more than 100 levels deep");
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value::Int(static_cast<int64_t>(u))
                                                    : Value::Float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) {
        ASSIGN_OR_RETURN(Value v, FromJson(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, x] : j.items()) {
        ASSIGN_OR_RETURN(Value v, FromJson(x, depth + 1));
        d.emplace_back(k, std::move(v));
      }
      return Value::MakeDict(std::move(d));
    }
    default: return Value::None();
  }
}

// JSON text (a call's arguments, a tool's parameters) as a template value; `field` names it.
absl::StatusOr<Value> ParseJsonField(const std::string& text, const std::string& field) {
  const auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(field, ": not JSON"));
  auto v = FromJson(j);
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", v.status().message()));
  return v;
}

// {"id", "type": "function", "function": {"name", "arguments"}}: the arguments parsed, as vLLM
// hands them to templates (empty arguments read as {}).
absl::StatusOr<Value> ToolCallValue(const ChatToolCall& call, const std::string& field) {
  Value arguments = Value::MakeDict({});
  if (!call.arguments.empty()) {
    ASSIGN_OR_RETURN(arguments, ParseJsonField(call.arguments, field + ".function.arguments"));
  }
  Value function = Value::MakeDict({{"name", Value::Str(call.name)}, {"arguments", std::move(arguments)}});
  return Value::MakeDict(
      {{"id", Value::Str(call.id)}, {"type", Value::Str("function")}, {"function", std::move(function)}});
}

// {"role", "content"} and, only where set, the keys templates test for ('tool_calls' in message).
absl::StatusOr<Value> MessageValue(const ChatMessage& m, size_t index) {
  Dict d = {{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}};
  if (!m.tool_calls.empty()) {
    List calls;
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      ASSIGN_OR_RETURN(Value call, ToolCallValue(m.tool_calls[j], absl::StrCat("messages[", index, "].tool_calls[", j, "]")));
      calls.push_back(std::move(call));
    }
    d.emplace_back("tool_calls", Value::MakeList(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d.emplace_back("tool_call_id", Value::Str(m.tool_call_id));
  if (!m.name.empty()) d.emplace_back("name", Value::Str(m.name));
  return Value::MakeDict(std::move(d));
}

// [{"type": "function", "function": {"name", "description", "parameters"}}], or None for no tools
// (what apply_chat_template passes when it is given none).
absl::StatusOr<Value> ToolsValue(const std::vector<ChatTool>& tools) {
  if (tools.empty()) return Value::None();
  List list;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ChatTool& t = tools[i];
    Dict f = {{"name", Value::Str(t.name)}};
    if (!t.description.empty()) f.emplace_back("description", Value::Str(t.description));
    if (!t.parameters.empty()) {
      ASSIGN_OR_RETURN(Value p, ParseJsonField(t.parameters, absl::StrCat("tools[", i, "].function.parameters")));
      f.emplace_back("parameters", std::move(p));
    }
    list.push_back(Value::MakeDict({{"type", Value::Str("function")}, {"function", Value::MakeDict(std::move(f))}}));
  }
  return Value::MakeList(std::move(list));
}

}  // namespace
}  // namespace jinja

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt,
                                                 const std::string& bos_token,
                                                 const std::string& eos_token,
                                                 const std::map<std::string, std::string>& extra) const {
  return Render(messages, {}, add_generation_prompt, bos_token, eos_token, extra);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const std::vector<ChatTool>& tools,
                                                 bool add_generation_prompt,
                                                 const std::string& bos_token,
                                                 const std::string& eos_token,
                                                 const std::map<std::string, std::string>& extra) const {
  using jinja::Value;
  jinja::List list;
  for (size_t i = 0; i < messages.size(); ++i) {
    ASSIGN_OR_RETURN(Value m, jinja::MessageValue(messages[i], i));
    list.push_back(std::move(m));
  }
  ASSIGN_OR_RETURN(Value tools_value, jinja::ToolsValue(tools));
  // What transformers passes: messages, tools, documents, add_generation_prompt, then the special
  // tokens and the caller's keyword arguments.
  jinja::Dict vars = {{"messages", Value::MakeList(std::move(list))},
                      {"tools", std::move(tools_value)},
                      {"documents", Value::None()},
                      {"add_generation_prompt", Value::Bool(add_generation_prompt)},
                      {"bos_token", Value::Str(bos_token)},
                      {"eos_token", Value::Str(eos_token)}};
  for (const auto& [k, v] : extra) vars.emplace_back(k, Value::Str(v));
  return jinja::RenderTemplate(*template_, vars, jinja::RenderOptions{fixed_time_});
}

absl::StatusOr<std::string> ChatTemplate::RenderJson(std::string_view variables_json) const {
  const auto j = nlohmann::ordered_json::parse(variables_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("chat template variables: not a JSON object");
  ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(j));
  return jinja::RenderTemplate(*template_, *v.dict, jinja::RenderOptions{fixed_time_});
}

}  // namespace specula
