// KV block bookkeeping: ids, reference counts, a free list and automatic prefix caching. It never
// touches tensors. A full block is identified by a hash chain over its tokens and its parent's
// hash (as vLLM does); a later sequence with the same prefix reuses the block instead of
// recomputing it. Cached blocks no sequence uses are evicted in LRU order. A block shared by
// several sequences or registered in the cache is full and is never written again.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/batch.h"

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
  int32_t MatchPrefix(absl::Span<const TokenId> tokens, int32_t max_tokens, std::vector<BlockId>* table);

  // Grows `table` to cover `num_tokens` slots. Returns false, changing nothing, if the pool
  // cannot supply the blocks (the scheduler then preempts).
  bool Reserve(std::vector<BlockId>* table, int32_t num_tokens);

  // Gives back the blocks past `num_tokens` (a watermark cut, e.g. rejected drafts).
  void Truncate(std::vector<BlockId>* table, int32_t num_tokens);

  // Drops the sequence's references; blocks whose count reaches zero become evictable if cached,
  // else free.
  void Release(std::vector<BlockId>* table);

  // Registers the full blocks covering tokens[0, num_committed) in the prefix cache. `num_hashed`
  // (per sequence, starts at 0) and `last_hash` remember how far the chain was built.
  void Commit(absl::Span<const TokenId> tokens, int32_t num_committed, const std::vector<BlockId>& table,
              int32_t* num_hashed, uint64_t* last_hash);

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
    uint64_t hash = 0;
    std::vector<TokenId> tokens;  // the block's tokens when cached, to rule out hash collisions
    std::list<BlockId>::iterator lru_pos;
    bool in_lru = false;
  };

  BlockId Allocate();  // requires num_available() > 0
  static uint64_t HashBlock(uint64_t parent, absl::Span<const TokenId> tokens);

  int32_t num_blocks_;
  int32_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;                       // [num_blocks]
  std::vector<BlockId> free_;                       // never-cached blocks with ref 0
  std::list<BlockId> lru_;                          // cached blocks with ref 0, oldest first
  std::unordered_map<uint64_t, BlockId> by_hash_;   // prefix cache
  int64_t query_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace specula
