#include "chat/chat.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "chat/chat_json.h"
#include "core/gguf.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::ordered_json;  // keys in the order given, as Python's json.loads keeps them

// tokenizer_config.json writes special tokens as a string or as {"content": ...}.
std::string TokenString(const json& j, const char* key) {
  if (!j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

absl::StatusOr<ChatSource> FromHfDir(const std::string& dir) {
  const std::string path = dir + "/tokenizer_config.json";
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  ChatSource s{"", TokenString(j, "bos_token"), TokenString(j, "eos_token"), path + ": chat_template"};
  if (j.contains("chat_template")) {
    const json& t = j["chat_template"];
    if (t.is_string()) s.template_text = t.get<std::string>();
    // A list of named templates: the "default" one.
    if (t.is_array()) {
      for (const json& e : t) {
        if (e.is_object() && e.value("name", json()) == "default" && e.contains("template") && e["template"].is_string()) {
          s.template_text = e["template"].get<std::string>();
        }
      }
    }
  }
  if (s.template_text.empty()) {
    return absl::NotFoundError(absl::StrCat(path, " has no chat_template; pass --chat-template FILE"));
  }
  return s;
}

absl::StatusOr<ChatSource> FromGguf(const std::string& path) {
  ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  ChatSource s;
  s.origin = path + ": tokenizer.chat_template";
  auto t = f.GetString("tokenizer.chat_template");
  if (!t.ok()) {
    if (absl::IsNotFound(t.status())) {
      return absl::NotFoundError(absl::StrCat(path, " has no tokenizer.chat_template; pass --chat-template FILE"));
    }
    return t.status();
  }
  s.template_text = std::string(*t);
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  auto token = [&](const char* key) -> std::string {
    auto id = f.GetInt(key);
    if (!id.ok() || !tokens.ok() || *id < 0 || static_cast<size_t>(*id) >= (*tokens)->size()) return "";
    return std::string((**tokens)[*id]);
  };
  s.bos_token = token("tokenizer.ggml.bos_token_id");
  s.eos_token = token("tokenizer.ggml.eos_token_id");
  return s;
}

// "SOURCE: message I: field 'F' ...": the file, the element and the field at fault.
absl::Status BadField(const std::string& source, size_t i, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": message ", i, ": field '", field, "' ", why));
}

// "FIELD: WHY" of ParseMessageToolFields.
absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::StatusOr<ChatToolCall> ParseToolCall(const json& c, size_t j) {
  const std::string field = absl::StrCat("tool_calls[", j, "]");
  if (!c.is_object()) return Bad(field, "must be an object");
  ChatToolCall call;
  if (c.contains("id")) {
    if (!c["id"].is_string()) return Bad(field + ".id", "must be a string");
    call.id = c["id"].get<std::string>();
  }
  if (c.contains("type") && c["type"] != "function") return Bad(field + ".type", "must be \"function\"");
  if (!c.contains("function") || !c["function"].is_object()) return Bad(field + ".function", "must be an object");
  const json& f = c["function"];
  if (!f.contains("name") || !f["name"].is_string()) return Bad(field + ".function.name", "must be a string");
  call.name = f["name"].get<std::string>();
  if (f.contains("arguments")) {
    const json& a = f["arguments"];
    if (a.is_string()) {
      call.arguments = a.get<std::string>();
      if (!call.arguments.empty() && json::parse(call.arguments, nullptr, false).is_discarded()) {
        return Bad(field + ".function.arguments", "must be JSON text");
      }
    } else if (a.is_object() || a.is_array()) {
      call.arguments = a.dump();
    } else if (!a.is_null()) {
      return Bad(field + ".function.arguments", "must be a string or an object");
    }
  }
  return call;
}

absl::StatusOr<ChatMessage> ParseMessage(const json& m, const std::string& source, size_t i) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
    return BadField(source, i, "role", "must be a string");
  }
  ChatMessage msg;
  msg.role = m["role"].get<std::string>();
  if (absl::Status st = ParseMessageToolFields(m, &msg); !st.ok()) {
    const std::string text(st.message());
    const size_t colon = text.find(": ");
    return BadField(source, i, text.substr(0, colon), text.substr(colon + 2));
  }
  // OpenAI sends a null content beside tool calls.
  const json content = m.value("content", json(nullptr));
  if (content.is_string()) {
    msg.content = content.get<std::string>();
  } else if (!content.is_null() || msg.tool_calls.empty()) {
    return BadField(source, i, "content", "must be a string");
  }
  return msg;
}

}  // namespace

absl::Status ParseMessageToolFields(const json& m, ChatMessage* msg) {
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (!m["tool_calls"].is_array()) return Bad("tool_calls", "must be a list");
    for (size_t j = 0; j < m["tool_calls"].size(); ++j) {
      ASSIGN_OR_RETURN(ChatToolCall call, ParseToolCall(m["tool_calls"][j], j));
      msg->tool_calls.push_back(std::move(call));
    }
  }
  for (auto [key, out] : {std::pair{"tool_call_id", &msg->tool_call_id}, std::pair{"name", &msg->name}}) {
    if (!m.contains(key) || m[key].is_null()) continue;
    if (!m[key].is_string()) return Bad(key, "must be a string");
    *out = m[key].get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<ChatSource> FindChatTemplate(const std::string& model_path, const std::string& override_path) {
  absl::StatusOr<ChatSource> s = IsDirectory(model_path) ? FromHfDir(model_path) : FromGguf(model_path);
  if (override_path.empty()) return s;
  ChatSource o = s.ok() ? *s : ChatSource{};
  ASSIGN_OR_RETURN(o.template_text, ReadTextFile(override_path));
  o.origin = override_path;
  return o;
}

absl::StatusOr<std::vector<ChatMessage>> ParseMessagesJson(const std::string& json_text, const std::string& source) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a non-empty JSON array of {\"role\", \"content\"}"));
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    ASSIGN_OR_RETURN(ChatMessage m, ParseMessage(j[i], source, i));
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<std::string> RenderChat(const ChatSource& source, const std::vector<ChatMessage>& messages,
                                       const std::vector<ChatTool>& tools) {
  auto t = ChatTemplate::Parse(source.template_text);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(source.origin, ": ", t.status().message()));
  auto text = t->Render(messages, tools, /*add_generation_prompt=*/true, source.bos_token, source.eos_token);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(source.origin, ": ", text.status().message()));
  return text;
}

}  // namespace specula
