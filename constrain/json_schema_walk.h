// The JSON Schema check of constrain/schema_check.h: one schema document walked without recursion,
// each keyword checked against what xgrammar's converter implements and against ConstraintLimits.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "constrain/limits.h"
#include "nlohmann/json_fwd.hpp"

namespace specula::constrain {

// What is wrong with the schema (a parsed JSON value; the text's nesting is bounded before it is
// parsed), naming the keyword and its JSON pointer, e.g. "'oneOf' at /properties/address is not
// supported"; nullopt when it passes. `prefix` is where the document stands in the constraint (a
// structural tag's member, "/format/json_schema"), put before every pointer; $refs resolve within
// the document.
std::optional<std::string> JsonSchemaProblem(const nlohmann::json& schema, const ConstraintLimits& limits,
                                             const std::string& prefix);

// `path` + "/" + `token` as a JSON pointer (RFC 6901: '~' and '/' escaped in the token).
std::string PointerChild(std::string_view path, std::string_view token);

}  // namespace specula::constrain
