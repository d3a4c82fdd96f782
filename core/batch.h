// The description of one forward call: a batch of sequences, each bringing any number of new tokens
// (a prefill chunk, one decode token, or 1 + k tokens to verify). Pure data, no tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace specula {

using TokenId = int32_t;
using BlockId = int32_t;

struct SequenceInput {
  // New tokens of this step: [num_new].
  absl::Span<const TokenId> tokens;
  // Position of tokens[0]. KV of positions [0, start_pos) is already in the cache. A start_pos below
  // what was cached before is a watermark cut: the new tokens overwrite the later slots.
  int32_t start_pos = 0;
  // Block ids covering positions [0, start_pos + num_new): [ceil((start_pos + num_new) / block_size)].
  absl::Span<const BlockId> block_table;
  // Logits for every new token of this sequence (speculative verification), whatever the mode.
  bool all_logits = false;
};

struct ForwardBatch {
  std::vector<SequenceInput> seqs;

  int32_t NumTokens() const {
    int32_t n = 0;
    for (const auto& s : seqs) n += static_cast<int32_t>(s.tokens.size());
    return n;
  }
};

}  // namespace specula
