// The check a structured-output constraint passes before it compiles. Compilation cannot be
// cancelled, so the size, nesting and repetition counts are bounded first (ConstraintLimits); and
// xgrammar ignores many JSON Schema keywords, some with a warning and some silently, which would let
// through output that the schema forbids, so every keyword it does not implement is refused by name.
#pragma once

#include "absl/status/status.h"
#include "constrain/limits.h"
#include "core/constraint_spec.h"

namespace specula {

// OK, or InvalidArgument naming spec.field (the kind's name when it has none), the construct and
// where it is: a JSON pointer in a schema or structural tag, a byte offset in a regex or grammar;
// e.g. "response_format.json_schema.schema: 'oneOf' at /properties/address is not supported".
// A regex or grammar is not fully validated here: xgrammar's own parse error comes from the compiler.
absl::Status CheckConstraint(const ConstraintSpec& spec, const ConstraintLimits& limits);

}  // namespace specula
