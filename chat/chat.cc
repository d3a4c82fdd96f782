#include "chat/chat.h"


#include "absl/strings/str_cat.h"
#include "core/gguf.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;

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

}  // namespace

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
    const json& m = j[i];
    for (const char* field : {"role", "content"}) {
      if (!m.is_object() || !m.contains(field) || !m[field].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": message ", i, ": field '", field, "' must be a string"));
      }
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

absl::StatusOr<std::string> RenderChat(const ChatSource& source, const std::vector<ChatMessage>& messages) {
  auto t = ChatTemplate::Parse(source.template_text);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(source.origin, ": ", t.status().message()));
  auto text = t->Render(messages, /*add_generation_prompt=*/true, source.bos_token, source.eos_token);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(source.origin, ": ", text.status().message()));
  return text;
}

}  // namespace specula
