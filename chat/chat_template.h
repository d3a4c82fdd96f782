// Chat templates: renders a model's Jinja chat template (GGUF `tokenizer.chat_template`, HF
// tokenizer_config.json `chat_template`) exactly as transformers' apply_chat_template does with
// Python jinja2, for the subset of Jinja that chat templates use (SmolLM2, Llama 3/3.1/3.2,
// Qwen2/2.5, Mistral v0.1-v0.3). transformers renders with
//   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                 extensions=[loopcontrols, generation tag])
// whose `tojson` is json.dumps(x, ensure_ascii=False) (insertion order, no HTML escaping), and adds
// the globals raise_exception() and strftime_now(). Anything outside the subset is an error at
// Parse() that names the construct and its line, never a silently different prompt.
#pragma once

#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

namespace jinja {
struct Template;
}  // namespace jinja

// A call an assistant message made (OpenAI's tool_calls[i]); `type` is always "function".
struct ChatToolCall {
  std::string id;
  std::string name;       // function.name
  std::string arguments;  // function.arguments: JSON text, as OpenAI sends it ("" reads as {})
};

// {role, content} alone initializes a plain message: the others have initializers of their own.
struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ChatToolCall> tool_calls = {};  // assistant messages that call tools
  std::string tool_call_id = {};  // tool messages: the call answered
  std::string name = {};          // tool messages: the function's name (optional)
};

// A function the model may call (OpenAI's tools[i].function). An empty description or parameters
// is absent: the template sees no such key.
struct ChatTool {
  std::string name;
  std::string description;
  std::string parameters;  // a JSON Schema, as JSON text
};

class ChatTemplate {
 public:
  // Parses the template. A construct outside the supported subset, or a syntax error, is an
  // InvalidArgument error such as "chat template line 3: unsupported filter 'wordcount'".
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders with the variables transformers passes: messages, tools=None, documents=None,
  // add_generation_prompt, bos_token, eos_token, plus `extra` (e.g. date_string). Runtime errors
  // (raise_exception() in the template, type errors, calling an undefined name) are
  // InvalidArgument errors that name the problem and the line. Const: renders may run
  // concurrently on one ChatTemplate.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt, const std::string& bos_token,
                                     const std::string& eos_token,
                                     const std::map<std::string, std::string>& extra = {}) const;

  // The same with tools, given as apply_chat_template(tools=...) gives them: `tools` is a list of
  // {"type": "function", "function": {"name", "description", "parameters"}} (None when empty).
  // Each message is {"role", "content"} plus, where set, "tool_calls" (each {"id", "type":
  // "function", "function": {"name", "arguments"}} with the arguments parsed into a mapping, as
  // vLLM does, since templates such as Qwen2.5's print them with `| tojson`), "tool_call_id" and
  // "name". Arguments or parameters that are not JSON are an InvalidArgument error naming the
  // field ("messages[2].tool_calls[0].function.arguments", "tools[1].function.parameters").
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const std::vector<ChatTool>& tools, bool add_generation_prompt,
                                     const std::string& bos_token, const std::string& eos_token,
                                     const std::map<std::string, std::string>& extra = {}) const;

  // Renders with the members of a JSON object as the variables, as given (messages with tool
  // calls, tools, documents, ...): for requests that carry more than roles and text.
  absl::StatusOr<std::string> RenderJson(std::string_view variables_json) const;

  // Fixes the time that strftime_now() formats (in UTC), for reproducible prompts and tests.
  // Unset, it is the local time at rendering, as in transformers.
  void set_fixed_time(std::time_t t) { fixed_time_ = t; }

 private:
  ChatTemplate() = default;  // only Parse() makes one

  std::shared_ptr<const jinja::Template> template_;  // immutable: copies share it
  std::optional<std::time_t> fixed_time_;
};

}  // namespace specula
