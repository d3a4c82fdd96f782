#include "tokenizer/pretokenize.h"

#include <unicode/uchar.h>

#include <cstdint>

#include "tokenizer/utf8.h"

namespace specula {
namespace {

struct Cp {
  int32_t cp;      // -1 for an invalid byte
  size_t offset;   // byte offset in the text
};

std::vector<Cp> Decode(std::string_view s) {
  std::vector<Cp> out;
  for (size_t i = 0, len; i < s.size(); i += len) out.push_back({DecodeUtf8(s, i, &len), i});
  return out;
}

bool IsL(int32_t c) { return c >= 0 && (U_GET_GC_MASK(c) & U_GC_L_MASK) != 0; }
bool IsN(int32_t c) { return c >= 0 && (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0; }
bool IsS(int32_t c) { return c >= 0 && u_isUWhiteSpace(c); }
bool IsOther(int32_t c) { return !IsL(c) && !IsN(c) && !IsS(c); }
bool IsNewline(int32_t c) { return c == '\r' || c == '\n'; }
int32_t Lower(int32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Length in code points of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
size_t Contraction(const std::vector<Cp>& c, size_t i, bool ignore_case) {
  if (c[i].cp != '\'' || i + 1 >= c.size()) return 0;
  auto ch = [&](size_t k) { return ignore_case ? Lower(c[k].cp) : c[k].cp; };
  const int32_t a = ch(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < c.size()) {
    const int32_t b = ch(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// `\s+(?!\S)|\s+` at i (c[i] is whitespace): the run, minus its last space if a non-space follows.
size_t TrailingSpace(const std::vector<Cp>& c, size_t i) {
  size_t j = i;
  while (j < c.size() && IsS(c[j].cp)) ++j;
  if (j < c.size() && j - i > 1) return j - 1 - i;
  return j - i;
}

size_t MatchGpt2(const std::vector<Cp>& c, size_t i) {
  if (size_t n = Contraction(c, i, false)) return n;
  const size_t j0 = (c[i].cp == ' ' && i + 1 < c.size()) ? i + 1 : i;
  for (auto pred : {IsL, IsN, IsOther}) {
    if (pred(c[j0].cp)) {
      size_t j = j0;
      while (j < c.size() && pred(c[j].cp)) ++j;
      return j - i;
    }
  }
  return TrailingSpace(c, i);
}

size_t MatchLlama3(const std::vector<Cp>& c, size_t i, size_t max_digits) {
  if (size_t n = Contraction(c, i, true)) return n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!IsNewline(c[j].cp) && !IsL(c[j].cp) && !IsN(c[j].cp) && j + 1 < c.size() &&
        IsL(c[j + 1].cp)) {
      ++j;
    }
    if (IsL(c[j].cp)) {
      while (j < c.size() && IsL(c[j].cp)) ++j;
      return j - i;
    }
  }
  // \p{N}{1,max_digits}
  if (IsN(c[i].cp)) {
    size_t j = i;
    while (j < c.size() && j - i < max_digits && IsN(c[j].cp)) ++j;
    return j - i;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    const size_t j0 = (c[i].cp == ' ' && i + 1 < c.size()) ? i + 1 : i;
    if (IsOther(c[j0].cp)) {
      size_t j = j0;
      while (j < c.size() && IsOther(c[j].cp)) ++j;
      while (j < c.size() && IsNewline(c[j].cp)) ++j;
      return j - i;
    }
  }
  // \s*[\r\n]+ : up to the last newline of the whitespace run.
  size_t end = i;
  while (end < c.size() && IsS(c[end].cp)) ++end;
  for (size_t r = end; r > i; --r) {
    if (IsNewline(c[r - 1].cp)) return r - i;
  }
  return TrailingSpace(c, i);
}

// The patterns that do not cover the text: the match length at i, or 0 (no match starts there).
bool IsPunctuationRun(int32_t c) {
  if (c < 0) return false;
  if ((U_GET_GC_MASK(c) & U_GC_P_MASK) != 0) return true;
  return c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|';
}

size_t MatchRun(const std::vector<Cp>& c, size_t i, bool (*pred)(int32_t)) {
  size_t j = i;
  while (j < c.size() && pred(c[j].cp)) ++j;
  return j - i;
}

size_t MatchThreeDigits(const std::vector<Cp>& c, size_t i) {
  if (i + 3 > c.size()) return 0;
  for (size_t k = i; k < i + 3; ++k) {
    if (c[k].cp < '0' || c[k].cp > '9') return 0;
  }
  return 3;
}

size_t Match(const std::vector<Cp>& c, size_t i, SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2: return MatchGpt2(c, i);
    case SplitPattern::kLlama3: return MatchLlama3(c, i, 3);
    case SplitPattern::kQwen2: return MatchLlama3(c, i, 1);
    case SplitPattern::kPunctuation: return MatchRun(c, i, IsPunctuationRun);
    case SplitPattern::kNumbers: return MatchRun(c, i, IsN);
    case SplitPattern::kThreeDigits: return MatchThreeDigits(c, i);
  }
  return 0;
}

}  // namespace

// GPT-2's reversible byte -> printable code point map.
std::vector<std::string> ByteToUnicode() {
  std::vector<std::string> m(256);
  int32_t n = 0;
  for (int32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    m[b] = Utf8(printable ? b : 256 + n++);
  }
  return m;
}

bool ParseSplitPattern(const std::string& regex, SplitPattern* out) {
  static const std::string kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const std::string kLlama3Head = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)";
  static const std::string kLlama3Tail = R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (regex == kGpt2) {
    *out = SplitPattern::kGpt2;
  } else if (regex == kLlama3Head + R"(\p{N}{1,3})" + kLlama3Tail) {
    *out = SplitPattern::kLlama3;
  } else if (regex == kLlama3Head + R"(\p{N})" + kLlama3Tail) {
    *out = SplitPattern::kQwen2;
  } else if (regex == R"([\p{P}\$\+<=>\^~\|]+)") {
    *out = SplitPattern::kPunctuation;
  } else if (regex == R"(\p{N}+)") {
    *out = SplitPattern::kNumbers;
  } else if (regex == R"([0-9][0-9][0-9])") {
    *out = SplitPattern::kThreeDigits;
  } else {
    return false;
  }
  return true;
}

std::vector<std::string> SplitWithPattern(std::string_view text, SplitPattern pattern) {
  const std::vector<Cp> c = Decode(text);
  auto offset = [&](size_t k) { return k < c.size() ? c[k].offset : text.size(); };
  std::vector<std::string> out;
  size_t unmatched = c.size();  // start of the run no match covers, or c.size() when none is open
  auto flush = [&](size_t end) {
    if (unmatched < end) out.emplace_back(text.substr(offset(unmatched), offset(end) - offset(unmatched)));
    unmatched = c.size();
  };
  for (size_t i = 0; i < c.size();) {
    const size_t n = Match(c, i, pattern);
    if (n == 0) {  // a regex search moves on by one character
      if (unmatched == c.size()) unmatched = i;
      ++i;
      continue;
    }
    flush(i);
    out.emplace_back(text.substr(offset(i), offset(i + n) - offset(i)));
    i += n;
  }
  flush(c.size());
  return out;
}

std::vector<std::string> SplitDigits(std::string_view text) {
  const std::vector<Cp> c = Decode(text);
  std::vector<std::string> out;
  size_t start = 0;  // byte offset of the pending non-numeric run
  for (const Cp& cp : c) {
    if (!IsN(cp.cp)) continue;
    if (cp.offset > start) out.emplace_back(text.substr(start, cp.offset - start));
    const size_t len = Utf8Len(text, cp.offset);
    out.emplace_back(text.substr(cp.offset, len));
    start = cp.offset + len;
  }
  if (start < text.size()) out.emplace_back(text.substr(start));
  return out;
}

}  // namespace specula
