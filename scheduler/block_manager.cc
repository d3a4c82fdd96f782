#include "scheduler/block_manager.h"

#include "absl/strings/str_cat.h"

namespace specula {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching),
      blocks_(num_blocks) {
  free_.reserve(num_blocks);
  for (BlockId i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

BlockId BlockManager::Allocate() {
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = lru_.front();  // evict the least recently used cached block
    lru_.pop_front();
    Block& b = blocks_[id];
    b.in_lru = false;
    by_hash_.erase(b.hash);
    b.cached = false;
    b.tokens.clear();
  }
  blocks_[id].ref = 1;
  return id;
}

void BlockManager::Take(BlockId id) {
  Block& b = blocks_[id];
  if (b.ref == 0 && b.in_lru) {
    lru_.erase(b.lru_pos);
    b.in_lru = false;
  }
  ++b.ref;
}

void BlockManager::Register(BlockId id, const BlockHash& hash, absl::Span<const TokenId> tokens) {
  Block& b = blocks_[id];
  b.cached = true;
  b.hash = hash;
  b.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(hash, id);
}

int32_t BlockManager::MatchPrefix(absl::Span<const TokenId> tokens, int32_t max_tokens, const BlockHash& root,
                                  std::vector<BlockId>* table) {
  if (!prefix_caching_) return 0;
  query_tokens_ += static_cast<int64_t>(tokens.size());
  BlockHash h = root;
  int32_t matched = 0;
  while (matched + block_size_ <= std::min<int32_t>(max_tokens, static_cast<int32_t>(tokens.size()))) {
    const auto block_tokens = tokens.subspan(matched, block_size_);
    h = ChainHash(h, block_tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const Block& b = blocks_[it->second];
    if (!std::equal(b.tokens.begin(), b.tokens.end(), block_tokens.begin(), block_tokens.end())) break;
    Take(it->second);
    table->push_back(it->second);
    matched += block_size_;
  }
  hit_tokens_ += matched;
  return matched;
}

int32_t BlockManager::CachedBlocks(absl::Span<const BlockHash> chain) const {
  if (!prefix_caching_) return 0;
  int32_t n = 0;
  while (n < static_cast<int32_t>(chain.size()) && by_hash_.contains(chain[n])) ++n;
  return n;
}

std::optional<BlockId> BlockManager::Install(const BlockHash& hash, absl::Span<const TokenId> tokens,
                                             std::vector<BlockId>* table) {
  if (auto it = by_hash_.find(hash); it != by_hash_.end()) {
    Take(it->second);
    table->push_back(it->second);
    return -1;
  }
  if (!prefix_caching_ || num_available() == 0) return std::nullopt;
  const BlockId id = Allocate();
  Register(id, hash, tokens);
  table->push_back(id);
  return id;
}

int32_t BlockManager::ResetPrefixCache() {
  const int32_t n = static_cast<int32_t>(by_hash_.size());
  for (BlockId id : lru_) {
    blocks_[id].in_lru = false;
    free_.push_back(id);
  }
  lru_.clear();
  for (Block& b : blocks_) {
    b.cached = false;
    b.tokens.clear();
  }
  by_hash_.clear();
  return n;
}

bool BlockManager::Reserve(std::vector<BlockId>* table, int32_t num_tokens) {
  const int32_t need = BlocksFor(num_tokens, block_size_) - static_cast<int32_t>(table->size());
  if (need <= 0) return true;
  if (need > num_available()) return false;
  for (int32_t i = 0; i < need; ++i) table->push_back(Allocate());
  return true;
}

void BlockManager::Truncate(std::vector<BlockId>* table, int32_t num_tokens) {
  const size_t keep = static_cast<size_t>(BlocksFor(num_tokens, block_size_));
  while (table->size() > keep) {
    std::vector<BlockId> last = {table->back()};
    table->pop_back();
    Release(&last);
  }
}

void BlockManager::Release(std::vector<BlockId>* table) {
  for (BlockId id : *table) {
    Block& b = blocks_[id];
    if (--b.ref > 0) continue;
    if (b.cached) {
      b.lru_pos = lru_.insert(lru_.end(), id);
      b.in_lru = true;
    } else {
      free_.push_back(id);
    }
  }
  table->clear();
}

void BlockManager::Commit(absl::Span<const TokenId> tokens, int32_t num_committed,
                          const std::vector<BlockId>& table, const BlockHash& root, std::vector<BlockHash>* chain) {
  if (!prefix_caching_) return;
  const int32_t full = std::min<int32_t>(num_committed / block_size_, static_cast<int32_t>(table.size()));
  for (int32_t i = static_cast<int32_t>(chain->size()); i < full; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    chain->push_back(ChainHash(chain->empty() ? root : chain->back(), block_tokens));
    const Block& b = blocks_[table[i]];
    if (!b.cached && !by_hash_.contains(chain->back())) Register(table[i], chain->back(), block_tokens);
  }
}

absl::Status BlockManager::CheckInvariants() const {
  std::vector<int> seen(num_blocks_, 0);
  for (BlockId id : free_) {
    if (blocks_[id].ref != 0 || blocks_[id].cached) return absl::InternalError(absl::StrCat("free block ", id, " is in use"));
    ++seen[id];
  }
  for (BlockId id : lru_) {
    if (blocks_[id].ref != 0 || !blocks_[id].cached) return absl::InternalError(absl::StrCat("evictable block ", id, " is in use"));
    ++seen[id];
  }
  for (BlockId id = 0; id < num_blocks_; ++id) {
    if (blocks_[id].ref < 0) return absl::InternalError(absl::StrCat("block ", id, " has negative ref count"));
    if (blocks_[id].ref > 0) ++seen[id];
    if (seen[id] != 1) return absl::InternalError(absl::StrCat("block ", id, " is in ", seen[id], " states"));
  }
  for (const auto& [h, id] : by_hash_) {
    if (!blocks_[id].cached || blocks_[id].hash != h) return absl::InternalError("prefix cache map is stale");
  }
  return absl::OkStatus();
}

}  // namespace specula
