// Structured-output constraints before they compile (CheckConstraint, constrain/schema_check.h). The
// input's first byte picks the kind ('0' none, '1' json_object, '2' json_schema, '3' regex, '4' choice,
// '5' grammar, '6' structural_tag; any byte picks one), the rest is the text, or for a choice the
// choices one per line. The check returns OK or InvalidArgument naming the field, whatever the text,
// within the bounds its walks keep (no recursion: a deep input must not overflow the stack).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "constrain/limits.h"
#include "constrain/schema_check.h"
#include "core/constraint_spec.h"

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
  if (!status.ok() && (status.code() != absl::StatusCode::kInvalidArgument ||
                       !std::string(status.message()).starts_with("constraint: "))) {
    __builtin_trap();
  }
  return 0;
}
