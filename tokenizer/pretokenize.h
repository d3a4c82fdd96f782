// Pre-tokenizer splits of HF tokenizers, hand-written for the regex patterns the Llama family uses
// (a general regex engine with \p{L} and look-ahead is not needed for these).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace specula {

enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|...
  kQwen2,   // as kLlama3 with \p{N} (single digits)
  // The three that llama.cpp's "default" BPE pre-tokenizer adds around kGpt2; they do not cover the
  // text, and what they leave between matches stays one piece (HF's Split "Isolated").
  kPunctuation,  // [\p{P}\$\+<=>\^~\|]+
  kNumbers,      // \p{N}+
  kThreeDigits,  // [0-9][0-9][0-9]
};

// Maps a tokenizer.json Split regex to a known pattern; false if unknown.
bool ParseSplitPattern(const std::string& regex, SplitPattern* out);

// Splits `text` into consecutive pieces that cover it exactly. Invalid UTF-8 bytes count as
// punctuation, so nothing is lost.
std::vector<std::string> SplitWithPattern(std::string_view text, SplitPattern pattern);

// Isolates each numeric code point, \p{N} as HF's Digits pre-tokenizer with individual_digits
// (Rust's char::is_numeric: "²", "½" and "٣" too, not only 0-9).
std::vector<std::string> SplitDigits(std::string_view text);

// GPT-2's reversible map from bytes to printable code points: [256] UTF-8 strings.
std::vector<std::string> ByteToUnicode();

}  // namespace specula
