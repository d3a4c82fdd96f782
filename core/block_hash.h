// The identity of a full KV block in the prefix cache: a 128-bit hash chained over the block's
// tokens and its parent's hash, from a root that a request's cache_salt sets. 128 bits because
// the same chain keys blocks shared between replicas (kvstore/), where no token comparison guards
// against a collision.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "core/batch.h"

namespace specula {

struct BlockHash {
  uint64_t hi = 0, lo = 0;

  bool operator==(const BlockHash& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const BlockHash& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.hi, b.lo);
  }
  std::string Hex() const;  // 32 hex digits
};

// The chain's root: all zeros without a salt, else XXH3-128 of the salt, so that requests with
// different salts never share a block.
BlockHash SaltRoot(std::string_view cache_salt);

// The hash of a block of `tokens` whose predecessor's hash is `parent` (the root for the first).
BlockHash ChainHash(const BlockHash& parent, absl::Span<const TokenId> tokens);

// The hashes of the full blocks of tokens[0, num_tokens), from `root`: [num_tokens / block_size].
std::vector<BlockHash> ChainHashes(const BlockHash& root, absl::Span<const TokenId> tokens, int32_t num_tokens,
                                   int32_t block_size);

}  // namespace specula
