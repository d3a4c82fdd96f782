// Scans of regexes and grammars against ConstraintLimits and xgrammar 0.2.9's regex support. A regex
// reaches xgrammar through two parsers: the EBNF converter (cpp/regex_converter.cc: a regex
// constraint, and the fallback of a schema's pattern) and the automaton builder (cpp/fsm_builder.cc:
// a schema's pattern first). What either rejects or ignores is refused here by name.
#include "constrain/pattern_check.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specula::constrain {
namespace {

using Problem = std::optional<std::string>;

// absl's string_view is its own type in this Abseil build: std::string_view goes into StrCat through it.
absl::string_view V(std::string_view s) { return {s.data(), s.size()}; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Escapes that both regex parsers read; any other letter or digit is matched as itself with a
// warning (\A, \Z, \z: anchors elsewhere) or refused by one parser and not the other.
constexpr std::string_view kRegexEscapes = "dDwWsSnrtvfaexuc0";

// a * b and a + b, held at `cap`: the sizes below only need to be compared with a bound.
int64_t CappedMul(int64_t a, int64_t b, int64_t cap) {
  if (a != 0 && b > cap / a) return cap;
  return std::min(a * b, cap);
}
int64_t CappedAdd(int64_t a, int64_t b, int64_t cap) { return a > cap - b ? cap : std::min(a + b, cap); }

// A decimal count from text[*pos], held at a value past any limit; false when there is no digit.
bool ReadCount(std::string_view text, size_t* pos, int64_t* value) {
  constexpr int64_t kHeld = int64_t{1} << 40;
  const size_t start = *pos;
  *value = 0;
  while (*pos < text.size() && IsDigit(text[*pos])) {
    *value = std::min(*value * 10 + (text[*pos] - '0'), kHeld);
    ++*pos;
  }
  return *pos > start;
}

// One regex, left to right. Each open group keeps the size of its body written out (every bounded
// repetition copied, as the automaton builder copies those up to 128): nested repetitions multiply,
// and the whole is bounded by max_text_bytes, as if the regex had been written out.
class RegexScanner {
 public:
  RegexScanner(std::string_view regex, const ConstraintLimits& limits)
      : re_(regex), limits_(limits), cap_(limits.max_text_bytes + 1) {}

  Problem Run() {
    groups_.push_back({});
    size_t i = 0;
    while (i < re_.size()) {
      size_t next = i + 1;
      if (Problem p = Step(i, &next)) return p;
      if (groups_.back().size >= cap_) {
        return absl::StrCat("repetitions written out at byte ", i, " are more than the limit of ",
                            limits_.max_text_bytes, " elements");
      }
      i = next;
    }
    return std::nullopt;
  }

 private:
  struct Group {
    int64_t size = 0;  // the body so far, written out
    int64_t last = 0;  // its last atom's part of it, which a repetition multiplies
  };

  void AddAtom(int64_t size) {
    Group& g = groups_.back();
    g.last = size;
    g.size = CappedAdd(g.size, size, cap_);
  }

  Problem Step(size_t i, size_t* next) {
    // Anchors stand where the whole pattern starts or ends: with xgrammar's whole-output match they
    // change nothing there, and elsewhere (an alternative's or a group's edge too) it drops them with
    // a warning, which would widen the regex.
    switch (re_[i]) {
      case '\\':
        AddAtom(1);
        return Escape(i, /*in_class=*/false, next);
      case '[':
        AddAtom(1);
        return Class(i, next);
      case '(':
        return Open(i, next);
      case ')':
        if (groups_.size() > 1) {
          const int64_t body = groups_.back().size;
          groups_.pop_back();
          AddAtom(body);
        }
        return std::nullopt;
      case '{':
        return Repetition(i, next);
      case '|':
        groups_.back().last = 0;
        return std::nullopt;
      case '*':
      case '+':
      case '?':
        return std::nullopt;
      case '^':
        if (i == 0) return std::nullopt;
        return absl::StrCat("'^' at byte ", i, " is not supported: only at the start of the pattern");
      case '$':
        if (i + 1 == re_.size()) return std::nullopt;
        return absl::StrCat("'$' at byte ", i, " is not supported: only at the end of the pattern");
      default:
        AddAtom(1);
        return std::nullopt;
    }
  }

  Problem Escape(size_t i, bool in_class, size_t* next) const {
    *next = i + 2;
    if (i + 1 >= re_.size()) return std::nullopt;  // a trailing backslash: xgrammar's error
    const char c = re_[i + 1];
    const std::string name = absl::StrCat("'\\", V(re_.substr(i + 1, 1)), "' at byte ", i);
    if (c == 'k' || (IsDigit(c) && c != '0' && !in_class)) {
      return absl::StrCat("backreference ", name, " is not supported");
    }
    if (c == 'p' || c == 'P') return absl::StrCat("Unicode property escape ", name, " is not supported");
    if ((c == 'b' && !in_class) || c == 'B') return absl::StrCat("word boundary ", name, " is not supported");
    if (c == 'u' && i + 2 < re_.size() && re_[i + 2] == '{') {
      const size_t close = re_.find('}', i + 3);
      if (close != std::string_view::npos) *next = close + 1;
      return std::nullopt;
    }
    const bool known = kRegexEscapes.find(c) != std::string_view::npos || (in_class && c == 'b');
    if ((IsAsciiAlpha(c) || IsDigit(c)) && !known) return absl::StrCat("escape ", name, " is not supported");
    return std::nullopt;
  }

  // [...]: its escapes checked; it ends at the first unescaped ']' after its first character.
  Problem Class(size_t i, size_t* next) const {
    size_t j = i + 1;
    if (j < re_.size() && re_[j] == '^') ++j;
    while (j < re_.size() && re_[j] != ']') {
      if (re_[j] == '\\') {
        if (Problem p = Escape(j, /*in_class=*/true, &j)) return p;
      } else {
        ++j;
      }
    }
    *next = j + 1;
    return std::nullopt;
  }

  Problem Open(size_t i, size_t* next) {
    if (static_cast<int64_t>(groups_.size()) > limits_.max_depth) {
      return absl::StrCat("parentheses at byte ", i, " are nested deeper than the limit of ", limits_.max_depth);
    }
    groups_.push_back({});
    if (i + 1 >= re_.size() || re_[i + 1] != '?') return std::nullopt;
    const std::string_view rest = re_.substr(i + 1);
    const std::string at = absl::StrCat(" at byte ", i, " is not supported");
    if (rest.starts_with("?:")) {
      *next = i + 3;
      return std::nullopt;
    }
    if (rest.starts_with("?=")) return absl::StrCat("lookahead '(?='", at);
    if (rest.starts_with("?!")) return absl::StrCat("lookahead '(?!'", at);
    if (rest.starts_with("?<=")) return absl::StrCat("lookbehind '(?<='", at);
    if (rest.starts_with("?<!")) return absl::StrCat("lookbehind '(?<!'", at);
    if (rest.starts_with("?<")) {
      // A named group: the EBNF converter takes letters only as its name (and ignores the name).
      size_t j = i + 3;
      while (j < re_.size() && IsAsciiAlpha(re_[j])) ++j;
      if (j > i + 3 && j < re_.size() && re_[j] == '>') {
        *next = j + 1;
        return std::nullopt;
      }
      return absl::StrCat("named group '(?<' with a name of other than letters", at);
    }
    return absl::StrCat("group modifier '(", V(rest.substr(0, 2)), "'", at);
  }

  // {n}, {n,}, {n,m}: each count within max_repeat; what it repeats is copied up to its upper count.
  Problem Repetition(size_t i, size_t* next) {
    size_t j = i + 1;
    int64_t low = 0;
    int64_t high = 0;
    if (!ReadCount(re_, &j, &low)) return std::nullopt;  // not a count: xgrammar's error
    bool bounded = true;
    if (j < re_.size() && re_[j] == ',') {
      ++j;
      bounded = ReadCount(re_, &j, &high);
    } else {
      high = low;
    }
    if (j >= re_.size() || re_[j] != '}') return std::nullopt;
    *next = j + 1;
    if (low > limits_.max_repeat || (bounded && high > limits_.max_repeat)) {
      return absl::StrCat("repetition '", V(re_.substr(i, j + 1 - i)), "' at byte ", i, " is more than the limit of ",
                          limits_.max_repeat);
    }
    Group& g = groups_.back();
    const int64_t copies = bounded ? high : low + 1;
    const int64_t repeated = CappedMul(g.last, copies, cap_);
    g.size = CappedAdd(g.size - g.last, repeated, cap_);
    g.last = repeated;
    return std::nullopt;
  }

  std::string_view re_;
  const ConstraintLimits& limits_;
  int64_t cap_;
  std::vector<Group> groups_;      // [open groups + 1]: the whole regex, then each open group
};

bool IsNameChar(char c, bool first) {
  return c == '_' || c == '-' || c == '.' || IsAsciiAlpha(c) || (!first && IsDigit(c));
}
bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The end of a string literal or character class that starts at text[i] and ends at `close`; neither
// spans a line in xgrammar's lexer.
size_t LiteralEnd(std::string_view text, size_t i, char close) {
  size_t j = i + 1;
  while (j < text.size() && text[j] != close && text[j] != '\n' && text[j] != '\r') j += text[j] == '\\' ? 2 : 1;
  return std::min(j + 1, text.size());
}

// A grammar's repetition {n}, {n,}, {n,m} or {n, -1} at text[i] (blanks allowed between its tokens,
// as xgrammar's lexer skips them): the problem when a count is past max_repeat.
Problem GrammarRepetition(std::string_view text, size_t i, const ConstraintLimits& limits, size_t* next) {
  auto skip = [&](size_t j) {
    while (j < text.size() && IsBlank(text[j])) ++j;
    return j;
  };
  size_t j = skip(i + 1);
  if (j < text.size() && text[j] == '+') ++j;
  int64_t low = 0;
  int64_t high = 0;
  if (!ReadCount(text, &j, &low)) return std::nullopt;
  j = skip(j);
  if (j < text.size() && text[j] == ',') {
    j = skip(j + 1);
    if (text.substr(j).starts_with("-1")) {
      j += 2;
    } else if (j < text.size() && text[j] == '+') {
      ++j;
    }
    ReadCount(text, &j, &high);
    j = skip(j);
  }
  if (j >= text.size() || text[j] != '}') return std::nullopt;
  *next = j + 1;
  if (std::max(low, high) <= limits.max_repeat) return std::nullopt;
  return absl::StrCat("repetition '", V(text.substr(i, j + 1 - i)), "' at byte ", i, " is more than the limit of ",
                      limits.max_repeat);
}

// Whether the rule name that ends before text[j] is defined there: `name ::=`, or with an attribute
// block, `name[max_tokens=10] ::=`.
bool DefinesRule(std::string_view text, size_t j, std::string_view* attributes) {
  while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
  if (j < text.size() && text[j] == '[') {
    const size_t close = text.find(']', j);
    if (close == std::string_view::npos) return false;
    *attributes = text.substr(j, close + 1 - j);
    j = close + 1;
    while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
  }
  return text.substr(j).starts_with("::=");
}

}  // namespace

std::optional<std::string> RegexProblem(std::string_view regex, const ConstraintLimits& limits) {
  return RegexScanner(regex, limits).Run();
}

std::optional<std::string> GrammarProblem(std::string_view text, const ConstraintLimits& limits) {
  int64_t depth = 0;
  bool line_start = true;  // nothing but blanks since the line began: where a rule's name stands
  bool has_root = false;
  int64_t rules = 0;
  int64_t repeats = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    size_t next = i + 1;
    const bool first_on_line = line_start;
    line_start = c == '\n' || c == '\r' || ((c == ' ' || c == '\t') && line_start);
    if (c == '#') {
      while (next < text.size() && text[next] != '\n' && text[next] != '\r') ++next;
      line_start = true;
    } else if (c == '"' || c == '[') {
      next = LiteralEnd(text, i, c == '"' ? '"' : ']');
    } else if (c == '(' && ++depth > limits.max_depth) {
      return absl::StrCat("parentheses at byte ", i, " are nested deeper than the limit of ", limits.max_depth);
    } else if (c == ')') {
      depth = std::max<int64_t>(depth - 1, 0);
    } else if (c == '{') {
      if (Problem p = GrammarRepetition(text, i, limits, &next)) return p;
      if (next > i + 1 && ++repeats > limits.max_grammar_repeats) {
        return absl::StrCat("repetition at byte ", i, " is more than the limit of ", limits.max_grammar_repeats,
                            " counted repetitions in a grammar");
      }
    } else if (IsNameChar(c, /*first=*/true)) {
      while (next < text.size() && IsNameChar(text[next], false)) ++next;
      std::string_view attributes;
      if (first_on_line && DefinesRule(text, next, &attributes)) {
        has_root = has_root || text.substr(i, next - i) == "root";
        // A rule's sampling temperature would have to change p and q alike; the engine samples
        // every token at the request's temperature.
        if (attributes.find("temperature") != std::string_view::npos) {
          return absl::StrCat("the rule at byte ", i, " sets a sampling temperature (", V(attributes),
                              "): per-rule temperatures are not supported (use the request's temperature)");
        }
        if (++rules > limits.max_grammar_rules) {
          return absl::StrCat("the rule at byte ", i, " is more than the limit of ", limits.max_grammar_rules,
                              " rules in a grammar");
        }
      }
    }
    i = next;
  }
  if (!has_root) return std::string("the grammar defines no rule named 'root' (`root ::= ...`)");
  return std::nullopt;
}

}  // namespace specula::constrain
