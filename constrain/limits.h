// The bounds a constraint is checked against before it compiles: compilation cannot be cancelled,
// so every input that passes must compile in bounded time (docs/structured_output.md gives the worst
// accepted input's compile time on the reference machine).
#pragma once

#include <cstdint>

namespace specula {

struct ConstraintLimits {
  int64_t max_text_bytes = 32 * 1024;  // a schema, regex, grammar or structural tag's source
  int32_t max_depth = 12;              // nesting: a schema's objects and arrays, a grammar's parentheses
  int32_t max_enum = 256;              // values of one enum, choices of one request
  int32_t max_repeat = 64;             // minItems/maxItems, minLength/maxLength, a regex's {n,m}
  int32_t max_properties = 128;        // properties of one object schema
  // Rules of one grammar: a chain of rules, each repeating the next, compiles in time that grows
  // faster than its length (160 such rules: 12 s; 64: under 2 s).
  int32_t max_grammar_rules = 64;
  // Counted repetitions ({n,m}) in one grammar: xgrammar writes each out, and rules that repeat rules
  // that repeat compile in time that grows steeply with their number (32 such: 1.7 s; 16: 0.13 s).
  int32_t max_grammar_repeats = 16;
  int32_t max_whitespace = 2;          // blanks in one gap between JSON tokens (max_whitespace_cnt)
  int64_t cache_bytes = 256LL << 20;   // the compiler's cache of compiled constraints
};

}  // namespace specula
