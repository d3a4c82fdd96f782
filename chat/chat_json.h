// A chat message's tool fields read from its JSON in OpenAI's shape: the one reader for messages
// files (chat/chat.h) and HTTP bodies (serving/openai_api.cc), which name the message their own way.
#pragma once

#include "absl/status/status.h"
#include "chat/chat_template.h"
#include "nlohmann/json_fwd.hpp"

namespace specula {

// Reads an assistant's `tool_calls` ([{"id"?, "type"?: "function", "function": {"name",
// "arguments"}}], the arguments as JSON text or as the JSON itself), a tool message's `tool_call_id`
// and `name` into `msg` (null reads as absent). Errors are InvalidArgument "FIELD: WHY" with FIELD
// within the message: "tool_calls[0].function.name: must be a string".
absl::Status ParseMessageToolFields(const nlohmann::ordered_json& message, ChatMessage* msg);

}  // namespace specula
