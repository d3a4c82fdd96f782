// The BPE core behind the tokenizer.json loader and the GGUF loader: a vocabulary, its merges, the
// added tokens and the normalizer / pre-tokenizer steps, all in memory. The loaders check their
// file and fill a BpeModel; MakeBpeTokenizer (in hf_tokenizer.cc) trusts it. Internal to tokenizer/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/batch.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace specula {

// One normalizer or pre-tokenizer step, named as in tokenizer.json.
struct BpeStep {
  std::string type;       // Prepend, Replace, NFC, NFKC, ByteLevel, Split, Digits or Metaspace
  std::string a, b;       // Prepend: a; Replace: a -> b; Metaspace: a = replacement
  SplitPattern pattern{};  // Split
  bool flag = false;      // ByteLevel: use_regex; Metaspace: split
  bool prefix = false;    // ByteLevel: add_prefix_space; Metaspace: prepend
};

enum class BpeTokenKind : uint8_t {
  kNormal,   // made by merges; decodes through the byte map or "▁"
  kSpecial,  // matched whole in the text before BPE; decodes to nothing (control tokens)
  kAdded,    // matched whole in the text before BPE; decodes to its own text (user-defined tokens)
};

// `left` and `right` next to each other become `merged`. The lowest cost merges first, and of
// equal costs the leftmost pair: cost is the rank for merge lists (tokenizer.json, GGUF gpt2) and
// minus the merged piece's score for sentencepiece vocabularies (GGUF llama).
struct BpeMerge {
  TokenId left = -1;
  TokenId right = -1;
  TokenId merged = -1;
  double cost = 0.0;
};

struct BpeModel {
  std::vector<std::string> pieces;   // [vocab] token text as stored (byte-level: mapped code points)
  std::vector<BpeTokenKind> kinds;   // [vocab]
  std::vector<BpeMerge> merges;      // ids in [0, vocab); the first of two equal pairs wins
  std::vector<BpeStep> normalizers;  // applied to each stretch of text between added tokens
  std::vector<BpeStep> pre_tokenizers;
  bool byte_fallback = false;  // pieces not in the vocabulary become <0xXX> tokens
  bool ignore_merges = false;  // a pre-token that is itself in the vocabulary is one token (Llama 3)
  TokenId unk_id = -1;
  TokenId bos_id = -1;
  std::vector<TokenId> eos_ids;
  bool add_bos_default = false;
};

// The tokenizer of a checked model (every id in range, pieces and kinds of equal length).
std::unique_ptr<Tokenizer> MakeBpeTokenizer(BpeModel model);

}  // namespace specula
