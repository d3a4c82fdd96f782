#include "model/kv_cache.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace specula {

namespace {
std::atomic<uint64_t> next_pool_id{1};
}  // namespace

KvCache::KvCache(const ModelConfig& model, const KvCacheConfig& config, Backend* backend)
    : id_(next_pool_id.fetch_add(1, std::memory_order_relaxed)),
      block_size_(config.block_size),
      num_blocks_(config.num_blocks > 0
                      ? config.num_blocks
                      : (model.max_seq_len + config.block_size - 1) / config.block_size),
      num_layers_(model.num_layers),
      num_kv_heads_(model.num_kv_heads),
      head_dim_(model.head_dim),
      backend_(backend),
      dtype_(config.dtype.value_or(backend != nullptr ? backend->dtype() : DType::kF32)) {
  const size_t elem = DTypeBytes(dtype_);
  layer_stride_ = static_cast<int64_t>(num_blocks_) * block_size_ * num_kv_heads_ * head_dim_ * elem;
  const size_t total = static_cast<size_t>(layer_stride_) * 2 * model.num_layers;
  if (backend_ == nullptr) {
    host_.assign((total + sizeof(float) - 1) / sizeof(float), 0.0f);
    base_ = reinterpret_cast<char*>(host_.data());
    return;
  }
  status_ = pool_.Grow(backend_, total, nullptr, /*scattered=*/true);
  if (!status_.ok()) {
    status_ = absl::ResourceExhaustedError(absl::StrCat("KV cache of ", num_blocks_, " blocks (", total,
                                                        " bytes): ", status_.message()));
    return;
  }
  base_ = pool_.as<char>();
}

int64_t KvCache::BlockBytes(const ModelConfig& model, int32_t block_size, DType dtype) {
  return static_cast<int64_t>(block_size) * model.num_kv_heads * model.head_dim * DTypeBytes(dtype) * 2 *
         model.num_layers;
}

std::vector<absl::string_view> KvCache::BlockPieces(BlockId id) const {
  const int64_t piece = layer_stride_ / num_blocks_;  // one block of one layer's K (or V)
  std::vector<absl::string_view> pieces;             // [num_layers * 2]
  pieces.reserve(2 * num_layers_);
  for (int64_t kv = 0; kv < 2 * num_layers_; ++kv) {
    pieces.emplace_back(base_ + kv * layer_stride_ + id * piece, piece);
  }
  return pieces;
}

absl::Status KvCache::WriteBlock(BlockId id, absl::string_view payload) {
  if (!on_host()) return absl::FailedPreconditionError("the KV pool is in device memory");
  const int64_t piece = layer_stride_ / num_blocks_;
  if (static_cast<int64_t>(payload.size()) != piece * 2 * num_layers_) {
    return absl::InvalidArgumentError(absl::StrCat("a KV block is ", piece * 2 * num_layers_, " bytes, got ",
                                                   payload.size()));
  }
  for (int64_t kv = 0; kv < 2 * num_layers_; ++kv) {
    std::memcpy(base_ + kv * layer_stride_ + id * piece, payload.data() + kv * piece, piece);
  }
  return absl::OkStatus();
}

PagedKvLayer KvCache::Layer(int32_t layer) {
  PagedKvLayer l;
  l.k = base_ + 2 * layer * layer_stride_;
  l.v = base_ + (2 * layer + 1) * layer_stride_;
  l.num_blocks = num_blocks_;
  l.block_size = block_size_;
  l.num_kv_heads = num_kv_heads_;
  l.head_dim = head_dim_;
  l.dtype = dtype_;
  return l;
}

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  free_.reserve(num_blocks);
  for (int32_t i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

absl::StatusOr<BlockId> BlockAllocator::Allocate() {
  if (free_.empty()) return absl::ResourceExhaustedError("KV cache is out of blocks");
  BlockId id = free_.back();
  free_.pop_back();
  return id;
}

void BlockAllocator::Free(BlockId id) { free_.push_back(id); }

SequenceBlocks::~SequenceBlocks() { Truncate(0); }

absl::Status SequenceBlocks::Reserve(int32_t num_tokens) {
  const size_t needed = (static_cast<size_t>(num_tokens) + block_size_ - 1) / block_size_;
  while (table_.size() < needed) {
    auto id = allocator_->Allocate();
    if (!id.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache is out of blocks: ", num_tokens, " tokens need ", needed,
          " blocks of ", block_size_, "; raise --num-blocks"));
    }
    table_.push_back(*id);
  }
  return absl::OkStatus();
}

void SequenceBlocks::Truncate(int32_t num_tokens) {
  const size_t keep = (static_cast<size_t>(num_tokens) + block_size_ - 1) / block_size_;
  while (table_.size() > keep) {
    allocator_->Free(table_.back());
    table_.pop_back();
  }
}

}  // namespace specula
