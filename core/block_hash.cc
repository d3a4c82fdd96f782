#include "core/block_hash.h"

#include <cstring>

#include "absl/strings/str_format.h"
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"

namespace specula {
namespace {

BlockHash FromXxh(XXH128_hash_t h) { return {h.high64, h.low64}; }

}  // namespace

std::string BlockHash::Hex() const { return absl::StrFormat("%016x%016x", hi, lo); }

BlockHash SaltRoot(std::string_view cache_salt) {
  if (cache_salt.empty()) return {};
  return FromXxh(XXH3_128bits(cache_salt.data(), cache_salt.size()));
}

BlockHash ChainHash(const BlockHash& parent, absl::Span<const TokenId> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const uint64_t p[2] = {parent.hi, parent.lo};
  XXH3_128bits_update(&state, p, sizeof(p));
  XXH3_128bits_update(&state, tokens.data(), tokens.size() * sizeof(TokenId));
  return FromXxh(XXH3_128bits_digest(&state));
}

std::vector<BlockHash> ChainHashes(const BlockHash& root, absl::Span<const TokenId> tokens, int32_t num_tokens,
                                   int32_t block_size) {
  std::vector<BlockHash> chain;
  BlockHash h = root;
  for (int32_t start = 0; start + block_size <= num_tokens; start += block_size) {
    h = ChainHash(h, tokens.subspan(start, block_size));
    chain.push_back(h);
  }
  return chain;
}

}  // namespace specula
