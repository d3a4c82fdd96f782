// KV block bookkeeping: ids, reference counts, a free list and automatic prefix caching. It never
// touches tensors. A full block is identified by a 128-bit hash chain over its tokens and its
// parent's hash (core/block_hash.h, as vLLM does), from a root its request's cache_salt sets; a later
// sequence with the same prefix and salt reuses the block instead of recomputing it. Cached blocks no sequence uses are evicted in LRU order. A block shared by
// several sequences or registered in the cache is full and is never written again.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/batch.h"
#include "core/block_hash.h"

namespace specula {

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  // Blocks that can be handed out now: free plus cached-but-unused (evictable).
  int32_t num_available() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
  static int32_t BlocksFor(int32_t num_tokens, int32_t block_size) {
    return (num_tokens + block_size - 1) / block_size;
  }

  // Appends to `table` the cached blocks that hold a prefix of `tokens` (ref counts taken) and
  // returns how many tokens they cover. At most `max_tokens` tokens are matched (callers leave
  // the last prompt token out so that its logits are computed).
  int32_t MatchPrefix(absl::Span<const TokenId> tokens, int32_t max_tokens, const BlockHash& root,
                      std::vector<BlockId>* table);
  // How many leading blocks of `chain` (a prefix's block hashes) the cache holds. No refs taken.
  int32_t CachedBlocks(absl::Span<const BlockHash> chain) const;
  // Registers a block that was computed elsewhere (a shared store's) under `hash`, holding
  // `tokens`: a new block with one ref is appended to `table` and returned, for the caller to fill
  // before anyone can match it, then release (it stays cached, evictable). If the hash is cached
  // already, that block is appended (ref taken) and -1 returned. nullopt: no block available.
  std::optional<BlockId> Install(const BlockHash& hash, absl::Span<const TokenId> tokens, std::vector<BlockId>* table);
  // Forgets every cached block (a flush): unused ones become free, used ones stay with their
  // sequences but are matched no more. Returns how many were forgotten.
  int32_t ResetPrefixCache();

  // Grows `table` to cover `num_tokens` slots. Returns false, changing nothing, if the pool
  // cannot supply the blocks (the scheduler then preempts).
  bool Reserve(std::vector<BlockId>* table, int32_t num_tokens);

  // Gives back the blocks past `num_tokens` (a watermark cut, e.g. rejected drafts).
  void Truncate(std::vector<BlockId>* table, int32_t num_tokens);

  // Drops the sequence's references; blocks whose count reaches zero become evictable if cached,
  // else free.
  void Release(std::vector<BlockId>* table);

  // Registers the full blocks covering tokens[0, num_committed) in the prefix cache. `chain` (per
  // sequence, starts empty) holds the hashes of the blocks registered so far, from `root`.
  void Commit(absl::Span<const TokenId> tokens, int32_t num_committed, const std::vector<BlockId>& table,
              const BlockHash& root, std::vector<BlockHash>* chain);

  // Statistics: prefix-cache lookups and hits, in tokens.
  int64_t query_tokens() const { return query_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }
  int32_t ref_count(BlockId id) const { return blocks_[id].ref; }

  // Every block is exactly one of: referenced, evictable (cached, ref 0), free. Tests call this.
  absl::Status CheckInvariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    bool cached = false;  // registered under `hash`
    BlockHash hash;
    std::vector<TokenId> tokens;  // the block's tokens when cached, to rule out hash collisions
    std::list<BlockId>::iterator lru_pos;
    bool in_lru = false;
  };

  BlockId Allocate();  // requires num_available() > 0
  void Take(BlockId id);  // one more ref on a cached block, out of the LRU list if it was there
  void Register(BlockId id, const BlockHash& hash, absl::Span<const TokenId> tokens);

  int32_t num_blocks_;
  int32_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;                       // [num_blocks]
  std::vector<BlockId> free_;                       // never-cached blocks with ref 0
  std::list<BlockId> lru_;                          // cached blocks with ref 0, oldest first
  absl::flat_hash_map<BlockHash, BlockId> by_hash_;  // prefix cache
  int64_t query_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace specula
