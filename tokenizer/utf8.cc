#include "tokenizer/utf8.h"

namespace specula {

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string Utf8(int32_t cp) {
  std::string s;
  AppendUtf8(static_cast<char32_t>(cp), &s);
  return s;
}

size_t TakeUtf8(std::string_view s, bool last, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const size_t n = Utf8LeadLen(c);
    size_t have = 1;
    while (n > 1 && have < n && i + have < s.size() && (static_cast<unsigned char>(s[i + have]) & 0xC0) == 0x80) ++have;
    if (n > 1 && have < n && i + have == s.size() && !last) return i;  // cut at the end: wait
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t j = 1; j < have; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[i + j]) & 0x3F);
    const bool valid = n == 1 || (n > 1 && have == n &&
                                  ((n == 2 && cp >= 0x80) || (n == 3 && cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) ||
                                   (n == 4 && cp >= 0x10000 && cp <= 0x10FFFF)));
    if (valid) {
      out->append(s.substr(i, n));
      i += n;
    } else {
      out->append(kReplacement);
      ++i;
    }
  }
  return i;
}

}  // namespace specula
