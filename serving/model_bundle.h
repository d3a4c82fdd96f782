// Everything a served request depends on that comes from the model: the engine (and through it the
// proposer, its suffix index, the cost tables and the grammar compiler with its cache), the
// tokenizer, the chat template and the version. A reload (Server::Reload) replaces the bundle as
// one; each request is bound to the bundle current at its admission and keeps it until it ends.
// No gRPC or HTTP types here.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chat/chat.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "request/boundary.h"

namespace specula {

struct ModelBundle {
  Engine* engine = nullptr;  // stepped by the engine loop's thread only; CompileConstraint from any
  const Tokenizer* tokenizer = nullptr;
  const ModelConfig* model = nullptr;
  // The weights' version (--model-version, or their hash): X-Specula-Model-Version, OpenAI's
  // system_fingerprint, gRPC's model_version, /v1/models and the metrics' label. Empty: none.
  std::string version;
  bool add_bos = true;  // prepend BOS to text prompts
  std::string spec_method = "none", num_spec_tokens = "0";  // for ModelInfo
  std::string source;  // the model's path, as loaded (logs and the reload's answer)
  // The chat template for /v1/chat/completions, or why there is none (chat requests then get a
  // 400 that says so). SetChat fills both.
  absl::StatusOr<ChatSource> chat_source = absl::NotFoundError("no chat template");
  std::optional<ChatTemplate> chat_template;
  // What keeps engine, tokenizer and model alive (null where the caller owns them). The bundle is
  // freed, and its memory given back to the system, once its last request and reader are gone.
  std::shared_ptr<void> owner;

  // Set by the server when it takes the bundle: what requests are normalized against, and the
  // engine's scheduler.
  RequestContext context;
  SchedulerConfig scheduler;

  ModelBundle() = default;
  ModelBundle(ModelBundle&&) = default;
  ModelBundle& operator=(ModelBundle&&) = default;
  ~ModelBundle();
};

// Parses `chat`'s template into the bundle; a template that does not parse leaves chat off, with the
// reason (logged), rather than failing the model.
void SetChat(absl::StatusOr<ChatSource> chat, ModelBundle* bundle);

// Whether the bundle's tokenizer can serve its chat template: each marker that a probe conversation's
// rendering prints (a `<|...|>` token, the template's BOS and EOS strings) must be one token of the
// vocabulary. A template for another vocabulary would otherwise split its markers into pieces the
// model never saw. INVALID_ARGUMENT naming `field` and the marker; OK without a template.
absl::Status CheckChatVocabulary(const ModelBundle& bundle, const std::string& field);

}  // namespace specula
