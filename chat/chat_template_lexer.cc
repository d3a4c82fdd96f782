// Chat templates: the lexer, as jinja2's (lexer.py) with trim_blocks and lstrip_blocks on. It
// splits the source into text and tags, applies the whitespace rules to the text, and tokenizes
// the inside of {{ }} and {% %} (comments are dropped).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"
#include "tokenizer/utf8.h"

namespace specula::jinja {
namespace {

constexpr size_t kMaxTagTokens = 1000;

absl::Status SyntaxError(int line, std::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", std::string(msg)));
}

// Python's str.isspace() (and regex \s) on the UTF-8 sequence at s[pos]; sets *len.
bool SpaceAt(std::string_view s, size_t pos, size_t* len) {
  const auto c = static_cast<unsigned char>(s[pos]);
  *len = 1;
  if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return true;
  if (c < 0x80) return false;
  // The non-ASCII whitespace: U+0085, U+00A0, U+1680, U+2000-200A, U+2028/9, U+202F, U+205F, U+3000.
  auto at = [&](size_t k) { return pos + k < s.size() ? static_cast<unsigned char>(s[pos + k]) : 0; };
  if (c == 0xC2 && (at(1) == 0x85 || at(1) == 0xA0)) return *len = 2, true;
  if (c == 0xE1 && at(1) == 0x9A && at(2) == 0x80) return *len = 3, true;
  if (c == 0xE2 && at(1) == 0x80 &&
      ((at(2) >= 0x80 && at(2) <= 0x8A) || at(2) == 0xA8 || at(2) == 0xA9 || at(2) == 0xAF)) {
    return *len = 3, true;
  }
  if (c == 0xE2 && at(1) == 0x81 && at(2) == 0x9F) return *len = 3, true;
  if (c == 0xE3 && at(1) == 0x80 && at(2) == 0x80) return *len = 3, true;
  return false;
}

size_t SkipSpace(std::string_view s, size_t pos) {
  size_t len;
  while (pos < s.size() && SpaceAt(s, pos, &len)) pos += len;
  return pos;
}

// Python's str.rstrip(): the length of `s` without trailing whitespace.
size_t RStripLen(std::string_view s) {
  size_t keep = 0;
  for (size_t pos = 0, len; pos < s.size(); pos += len) {
    if (!SpaceAt(s, pos, &len)) keep = pos + len;
  }
  return keep;
}

int CountNewlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Python's unicode-escape decoding of a string literal's body (jinja2 unescapes this way).
absl::StatusOr<std::string> Unescape(std::string_view body, int line) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '\\' || k + 1 == body.size()) {
      out += body[k];
      continue;
    }
    const char c = body[++k];
    switch (c) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': case 'u': case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        if (k + n >= body.size()) {
          return SyntaxError(line, absl::StrCat("truncated \\", std::string(1, c), " escape"));
        }
        const std::string hex(body.substr(k + 1, n));
        char* end = nullptr;
        const unsigned long cp = std::strtoul(hex.c_str(), &end, 16);
        if (end != hex.c_str() + n || cp > 0x10FFFF) {
          return SyntaxError(line, absl::StrCat("bad \\", std::string(1, c), " escape"));
        }
        AppendUtf8(static_cast<char32_t>(cp), &out);
        k += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = 0;
          size_t n = 0;
          while (n < 3 && k < body.size() && body[k] >= '0' && body[k] <= '7') {
            cp = cp * 8 + (body[k++] - '0');
            ++n;
          }
          --k;
          AppendUtf8(cp, &out);
        } else {
          out += '\\';  // unknown escapes stay as written
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Every \r\n, \r and \n is a newline; one trailing newline is dropped (keep_trailing_newline
    // is off).
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t start = NextTag(pos);
      if (start == std::string::npos) {
        Emit(Token::Kind::kText, src_.substr(pos));
        break;
      }
      const char kind = src_[start + 1];
      const char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')
                            ? src_[start + 2] : 0;
      std::string_view text(src_.data() + pos, start - pos);
      const int text_newlines = CountNewlines(text);
      if (sign == '-') {
        text = text.substr(0, RStripLen(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes the line's indent.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            SkipSpace(text, l_pos) == text.size()) {
          text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Kind::kText, std::string(text));
      line_ += text_newlines;
      pos = start + 2 + (sign ? 1 : 0);
      if (kind == '%' && IsRawTag(pos)) return SyntaxError(line_, "unsupported tag 'raw'");
      if (kind == '#') {
        ASSIGN_OR_RETURN(pos, SkipComment(pos));
      } else {
        ASSIGN_OR_RETURN(pos, LexTag(kind == '%', pos));
      }
      line_starting = src_[pos - 1] == '\n';
    }
    Emit(Token::Kind::kEof, "");
    return std::move(tokens_);
  }

 private:
  size_t NextTag(size_t pos) const {
    for (size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) {
        return k;
      }
    }
    return std::string::npos;
  }

  void Emit(Token::Kind kind, std::string text) {
    tokens_.push_back(Token{kind, std::move(text), line_});
  }

  bool IsRawTag(size_t pos) const {
    pos = SkipSpace(src_, pos);
    if (src_.compare(pos, 3, "raw") != 0) return false;
    pos = SkipSpace(src_, pos + 3);
    return src_.compare(pos, 2, "%}") == 0 || src_.compare(pos, 3, "-%}") == 0;
  }

  // The end of a tag at `pos`, if there is one: `+%}`, `-%}` and following whitespace, or `%}`
  // and (trim_blocks) one newline. Variables end with `-}}` and whitespace, or `}}`.
  size_t TagEnd(size_t pos, char brace, bool trim) const {
    const char close[3] = {brace, '}', 0};
    if (trim && src_[pos] == '+' && src_.compare(pos + 1, 2, close) == 0) return pos + 3;
    if (src_[pos] == '-' && src_.compare(pos + 1, 2, close) == 0) return SkipSpace(src_, pos + 3);
    if (src_.compare(pos, 2, close) == 0) {
      return pos + 2 + (trim && pos + 2 < src_.size() && src_[pos + 2] == '\n' ? 1 : 0);
    }
    return std::string::npos;
  }

  absl::StatusOr<size_t> SkipComment(size_t pos) {
    for (size_t k = pos; k < src_.size(); ++k) {
      const size_t end = TagEnd(k, '#', true);
      if (end != std::string::npos) {
        line_ += CountNewlines(std::string_view(src_).substr(pos, end - pos));
        return end;
      }
    }
    return SyntaxError(line_, "unterminated comment: missing '#}'");
  }

  absl::StatusOr<size_t> LexTag(bool block, size_t pos) {
    const int open_line = line_;
    Emit(block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "");
    std::string balance;  // the closing brackets expected, innermost last
    const size_t first_token = tokens_.size();
    while (true) {
      // Bounds the size (and so the depth) of one expression: `1+1+...` nests one level per `+`.
      if (tokens_.size() - first_token > kMaxTagTokens) {
        return SyntaxError(open_line, absl::StrCat("tag longer than ", kMaxTagTokens, " tokens"));
      }
      if (pos >= src_.size()) {
        return SyntaxError(open_line, absl::StrCat("unterminated tag: missing '",
                                                   block ? "%}" : "}}", "'"));
      }
      // An end marker only counts outside brackets: {{ {'a': {'b': 1}} }} ends at the last }}.
      const size_t end = balance.empty() ? TagEnd(pos, block ? '%' : '}', block)
                                         : std::string::npos;
      if (end != std::string::npos) {
        Emit(block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "");
        line_ += CountNewlines(std::string_view(src_).substr(pos, end - pos));
        return end;
      }
      size_t len;
      if (SpaceAt(src_, pos, &len)) {
        line_ += src_[pos] == '\n';
        pos += len;
        continue;
      }
      const char c = src_[pos];
      if (c >= '0' && c <= '9') {
        RETURN_IF_ERROR(LexNumber(&pos));
      } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        size_t k = pos;
        while (k < src_.size() && (src_[k] == '_' || std::isalnum(static_cast<unsigned char>(src_[k])))) ++k;
        Emit(Token::Kind::kName, src_.substr(pos, k - pos));
        pos = k;
      } else if (c == '\'' || c == '"') {
        size_t k = pos + 1;
        while (k < src_.size() && src_[k] != c) k += src_[k] == '\\' ? 2 : 1;
        if (k >= src_.size()) return SyntaxError(line_, "unterminated string literal");
        ASSIGN_OR_RETURN(std::string s, Unescape(std::string_view(src_).substr(pos + 1, k - pos - 1), line_));
        Emit(Token::Kind::kString, std::move(s));
        line_ += CountNewlines(std::string_view(src_).substr(pos, k - pos));
        pos = k + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*",
                                           "%", "~", "[", "]", "(", ")", "{", "}", ">", "<", "=",
                                           ".", ":", "|", ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps) {
          if (src_.compare(pos, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        }
        if (op == nullptr) {
          return SyntaxError(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        const std::string o(op);
        if (o == "(" || o == "[" || o == "{") {
          balance += o == "(" ? ')' : o == "[" ? ']' : '}';
        } else if (o == ")" || o == "]" || o == "}") {
          if (balance.empty() || balance.back() != o[0]) {
            return SyntaxError(line_, absl::StrCat("unexpected '", o, "'"));
          }
          balance.pop_back();
        }
        Emit(Token::Kind::kOp, o);
        pos += o.size();
      }
    }
  }

  // Python-style integer and float literals (jinja2 allows '_' between digits).
  absl::Status LexNumber(size_t* pos) {
    size_t k = *pos;
    auto digits = [&](size_t at) {
      size_t e = at;
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) ||
                                 (src_[e] == '_' && e > at && e + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[e + 1]))))) {
        ++e;
      }
      return e;
    };
    std::string text;
    const bool after_dot = k > 0 && src_[k - 1] == '.';  // x.0.1 is two subscripts, not a float
    if (src_[k] == '0' && k + 1 < src_.size() && std::strchr("xXoObB", src_[k + 1]) != nullptr) {
      const int base = std::strchr("xX", src_[k + 1]) ? 16 : std::strchr("oO", src_[k + 1]) ? 8 : 2;
      size_t e = k + 2;
      while (e < src_.size() && std::isxdigit(static_cast<unsigned char>(src_[e]))) ++e;
      errno = 0;
      const std::string body = src_.substr(k + 2, e - k - 2);
      char* end = nullptr;
      const long long v = std::strtoll(body.c_str(), &end, base);
      if (body.empty() || *end != 0 || errno == ERANGE) return SyntaxError(line_, "bad integer literal");
      tokens_.push_back(Token{Token::Kind::kInt, "", line_, v});
      *pos = e;
      return absl::OkStatus();
    }
    size_t e = digits(k);
    bool is_float = false;
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        e = digits(x);
        is_float = true;
      }
    }
    for (size_t m = k; m < e; ++m) {
      if (src_[m] != '_') text += src_[m];
    }
    if (is_float) {
      tokens_.push_back(Token{Token::Kind::kFloat, "", line_, 0, std::strtod(text.c_str(), nullptr)});
    } else {
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return SyntaxError(line_, "integer literal out of range");
      tokens_.push_back(Token{Token::Kind::kInt, "", line_, v});
    }
    *pos = e;
    return absl::OkStatus();
  }

  std::string src_;
  int line_ = 1;
  std::vector<Token> tokens_;
};


}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace specula::jinja
