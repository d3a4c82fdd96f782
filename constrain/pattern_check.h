// The text-level checks of constrain/schema_check.h: a regex (a regex constraint, a schema's
// `pattern` or `patternProperties` key, a structural tag's regex) and an EBNF/GBNF grammar, scanned
// for their bounds and for what xgrammar's regex converters reject or ignore. Neither is fully
// parsed: a syntax error is xgrammar's to report when the constraint compiles.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "constrain/limits.h"

namespace specula::constrain {

// What is wrong with the regex, naming the construct and its byte offset, e.g. "repetition '{100}'
// at byte 3 is more than the limit of 64"; nullopt when the scan finds nothing.
std::optional<std::string> RegexProblem(std::string_view regex, const ConstraintLimits& limits);

// The same for a grammar in xgrammar's EBNF (GBNF): parenthesis nesting outside string literals,
// character classes and comments, repetition counts, and a rule named `root`.
std::optional<std::string> GrammarProblem(std::string_view grammar, const ConstraintLimits& limits);

}  // namespace specula::constrain
