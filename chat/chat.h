// A model's chat template and special tokens, found beside its weights (GGUF
// `tokenizer.chat_template`, or HF `tokenizer_config.json`'s `chat_template`), and applied to a
// conversation with the Jinja subset of chat/chat_template.h.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chat/chat_template.h"

namespace specula {

struct ChatSource {
  std::string template_text;  // the Jinja source
  std::string bos_token, eos_token;  // the strings the template may print
  std::string origin;  // where it came from, for errors ("FILE: tokenizer.chat_template")
};

// The template of the model at `model_path` (a GGUF file or an HF directory), or of `override_path`
// (a file holding the Jinja source) when not empty. NotFound naming the place looked in when the
// model has none.
absl::StatusOr<ChatSource> FindChatTemplate(const std::string& model_path, const std::string& override_path = "");

// Parses a messages file: a JSON array of {"role": ..., "content": ...} in OpenAI's shape, with an
// assistant's "tool_calls" ([{"id", "type": "function", "function": {"name", "arguments"}}], the
// arguments as JSON text or as the JSON itself; its content may then be null or absent), a tool
// message's "tool_call_id" and "name". Errors name the file, the element and the field
// ("FILE: message 2: field 'tool_calls[0].function.name' must be a string").
absl::StatusOr<std::vector<ChatMessage>> ParseMessagesJson(const std::string& json_text, const std::string& source);

// The prompt text for `messages`, ending with the assistant's turn opened; `tools` reach the
// template as ChatTemplate::Render describes.
absl::StatusOr<std::string> RenderChat(const ChatSource& source, const std::vector<ChatMessage>& messages,
                                       const std::vector<ChatTool>& tools = {});

}  // namespace specula
