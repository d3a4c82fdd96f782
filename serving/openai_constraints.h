// Structured output on the OpenAI-compatible surface: the constraint fields of OpenAI, vLLM and
// llama.cpp mapped to one ConstraintSpec. Exactly one source per request; two are refused by name.
#pragma once

#include "absl/status/status.h"
#include "core/constraint_spec.h"
#include "nlohmann/json_fwd.hpp"

namespace specula {

// Reads, from a chat or completions body:
//   response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
//     "schema", "strict", "description"}} (OpenAI);
//   structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object" |
//     "structural_tag"} (vLLM), and its older guided_json, guided_regex, guided_choice,
//     guided_grammar;
//   json_schema and grammar (llama.cpp's server, GBNF).
// Leaves `out` inactive when none is set. Errors are InvalidArgument naming the field.
absl::Status ParseConstraintFields(const nlohmann::ordered_json& body, ConstraintSpec* out);

}  // namespace specula
