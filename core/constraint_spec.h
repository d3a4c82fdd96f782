// What a request's tokens must follow (structured output), wire-neutral: each surface fills it from
// its own fields (response_format, structured_outputs, guided_*, llama.cpp's json_schema and grammar,
// tools) and constrain/ compiles it. In core/ so that request/ and constrain/ share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specula {

struct ConstraintSpec {
  enum class Kind : uint8_t {
    kNone,
    kJsonObject,     // any JSON object (response_format json_object)
    kJsonSchema,     // `text` is a JSON Schema
    kRegex,          // `text` is a regular expression over the whole output
    kChoice,         // exactly one of `choices`
    kGrammar,        // `text` is a grammar in GBNF / xgrammar's EBNF, root rule `root`
    kStructuralTag,  // `text` is an xgrammar structural tag (JSON): tool calls
  };
  Kind kind = Kind::kNone;
  std::string text;
  std::vector<std::string> choices;  // kChoice
  // The wire field it came from, named in every error about it ("response_format.json_schema.schema").
  std::string field;
  // JSON kinds: no optional whitespace (separators ", " and ": "), as vLLM's disable_any_whitespace:
  // compact output, and keys and separators the grammar forces whole (drafts it proposes).
  bool compact_json = false;

  bool active() const { return kind != Kind::kNone; }
};

// "json_schema", "regex", ...: the kind's name in errors and metrics.
inline const char* ConstraintKindName(ConstraintSpec::Kind k) {
  switch (k) {
    case ConstraintSpec::Kind::kNone: return "none";
    case ConstraintSpec::Kind::kJsonObject: return "json_object";
    case ConstraintSpec::Kind::kJsonSchema: return "json_schema";
    case ConstraintSpec::Kind::kRegex: return "regex";
    case ConstraintSpec::Kind::kChoice: return "choice";
    case ConstraintSpec::Kind::kGrammar: return "grammar";
    case ConstraintSpec::Kind::kStructuralTag: return "structural_tag";
  }
  return "none";
}

}  // namespace specula
