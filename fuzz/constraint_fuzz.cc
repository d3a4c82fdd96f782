// Structured-output constraints through the check and the compiler (ConstraintCompiler::Compile:
// CheckConstraint, constrain/schema_check.h, then xgrammar). The input's first byte picks the kind
// ('0' none, '1' json_object, '2' json_schema, '3' regex, '4' choice, '5' grammar, '6' structural_tag;
// any byte picks one), the rest is the text, or for a choice the choices one per line. The check
// returns OK or InvalidArgument naming the field, whatever the text, within the bounds its walks keep
// (no recursion: a deep input must not overflow the stack); what passes it is compiled over a small
// byte vocabulary, where xgrammar's parsers and converters meet only bounded input, and must compile
// or fail with InvalidArgument naming the field, never crash.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "constrain/constraint.h"
#include "constrain/limits.h"
#include "constrain/schema_check.h"
#include "core/constraint_spec.h"

namespace {

// Every byte as a token, a few multi-byte tokens JSON output uses, and a stop token (id 300).
const specula::ConstraintCompiler& Compiler() {
  static const specula::ConstraintCompiler* compiler = [] {
    specula::ConstraintVocab v;
    for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",", " \"", "true", "false", "null", "\n", "  "}) v.token_bytes.push_back(t);
    v.token_bytes.resize(300);
    v.token_bytes.push_back("");  // the stop token
    v.stop_ids = {300};
    specula::ConstraintLimits limits;
    limits.cache_bytes = 16 << 20;
    return specula::ConstraintCompiler::Create(std::move(v), limits).release();
  }();
  return *compiler;
}

bool NamesTheField(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument &&
         std::string(status.message()).starts_with("constraint: ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using Kind = specula::ConstraintSpec::Kind;
  if (size == 0) return 0;
  constexpr int kKinds = static_cast<int>(Kind::kStructuralTag) + 1;
  specula::ConstraintSpec spec;
  spec.kind = static_cast<Kind>(static_cast<uint8_t>(data[0] - '0') % kKinds);
  spec.field = "constraint";
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (spec.kind == Kind::kChoice) {
    size_t start = 0;
    while (start <= text.size()) {
      const size_t end = std::min(text.find('\n', start), text.size());
      spec.choices.emplace_back(text.substr(start, end - start));
      start = end + 1;
    }
  } else {
    spec.text = std::string(text);
  }
  const absl::Status status = specula::CheckConstraint(spec, specula::ConstraintLimits{});
  if (!status.ok() && !NamesTheField(status)) __builtin_trap();
  if (!status.ok() || !spec.active()) return 0;
  const absl::Status compiled = Compiler().Compile(spec).status();
  if (!compiled.ok() && !NamesTheField(compiled)) __builtin_trap();
  return 0;
}
