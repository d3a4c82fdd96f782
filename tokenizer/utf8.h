// UTF-8, one helper for the tokenizers, the chat templates and the output processor.
// Decoding is lenient, as the tokenizers' splits and Python's surrogateescape need: a lead byte
// followed by its continuation bytes is one sequence (overlong forms and surrogates included), and
// anything else is one invalid byte. TakeUtf8, for text that leaves the process, is strict.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specula {

// Length of the UTF-8 sequence that lead byte `b` starts (1 to 4), 0 if `b` starts none.
inline size_t Utf8LeadLen(uint8_t b) {
  return b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
}

// Length of the UTF-8 sequence at text[i] (1 for an invalid byte).
inline size_t Utf8Len(std::string_view text, size_t i) {
  const size_t len = Utf8LeadLen(static_cast<uint8_t>(text[i]));
  if (len == 0 || i + len > text.size()) return 1;
  for (size_t k = 1; k < len; ++k) {
    if ((static_cast<uint8_t>(text[i + k]) & 0xC0) != 0x80) return 1;
  }
  return len;
}

// The code point of the UTF-8 sequence at text[i], -1 for an invalid byte; its length (Utf8Len)
// in *len.
inline int32_t DecodeUtf8(std::string_view text, size_t i, size_t* len) {
  *len = Utf8Len(text, i);
  const uint8_t b0 = static_cast<uint8_t>(text[i]);
  if (*len == 1) return b0 < 0x80 ? b0 : -1;
  int32_t cp = b0 & (0xFF >> (*len + 1));
  for (size_t k = 1; k < *len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
  return cp;
}

// Appends the UTF-8 encoding of a code point (at most U+10FFFF).
void AppendUtf8(char32_t cp, std::string* out);

// The UTF-8 encoding of a code point.
std::string Utf8(int32_t cp);

// Appends to `out` the UTF-8 of `s` that can be sent now, each invalid byte replaced by U+FFFD
// (Protobuf strings and JSON must be valid UTF-8), and returns the bytes of `s` consumed. A
// multi-byte character cut at the end (a token may end inside one) waits unless `last`.
size_t TakeUtf8(std::string_view s, bool last, std::string* out);

}  // namespace specula
