// KV storage addressed by block id: one pool of fixed-size blocks for every layer. Sequences own
// block tables (lists of ids); attention reads K/V through them. The block manager with reference
// counts and prefix caching lives in scheduler/; BlockAllocator here is the simple free list the
// single-sequence paths use.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/batch.h"
#include "model/model_config.h"
#include "kernels/backend.h"

namespace specula {

struct KvCacheConfig {
  int32_t block_size = 16;  // token slots per block
  int32_t num_blocks = 0;   // pool size; 0 = enough for one sequence of max_seq_len
  // Element type of the pool (--kv-cache-dtype); unset: the backend's compute dtype (f32 on the
  // host). The backend must support it (Backend::SupportsKvDtype), which LlamaModel checks.
  std::optional<DType> dtype = std::nullopt;
};

class KvCache {
 public:
  // The pool is one allocation in `backend`'s memory (the model's backend), or in host memory when
  // `backend` is null. Check status() before use: allocation can fail.
  KvCache(const ModelConfig& model, const KvCacheConfig& config, Backend* backend = nullptr);
  ~KvCache() {
    if (on_destroy_) on_destroy_(id_);
  }
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const absl::Status& status() const { return status_; }
  PagedKvLayer Layer(int32_t layer);
  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  const Backend* backend() const { return backend_; }
  DType dtype() const { return dtype_; }
  // Unique to this pool for the process's lifetime (never reused, unlike its address): what
  // captured CUDA graphs, which bake in the pool's device pointers, are keyed on.
  uint64_t id() const { return id_; }

  // Bytes one block takes across all layers (K and V) in `dtype`.
  static int64_t BlockBytes(const ModelConfig& model, int32_t block_size, DType dtype);

  // Whether blocks can be copied in and out by the host (BlockPieces, WriteBlock): a pool in host
  // memory, not a device's.
  bool on_host() const { return backend_ == nullptr || !backend_->on_device(); }
  // Block `id`'s bytes in every layer, K then V per layer: [num_layers * 2] pieces of
  // block_size * num_kv_heads * head_dim elements each, pointing into the pool. Requires on_host().
  std::vector<absl::string_view> BlockPieces(BlockId id) const;
  // Fills block `id` from `payload`, BlockPieces' bytes concatenated in order. Errors: a device
  // pool, a payload of another size.
  absl::Status WriteBlock(BlockId id, absl::string_view payload);

  // Called with id() when the pool is destroyed (a tensor-parallel target tells the other ranks to
  // drop their share of it).
  void set_on_destroy(std::function<void(uint64_t)> f) { on_destroy_ = std::move(f); }

 private:
  std::function<void(uint64_t)> on_destroy_;
  uint64_t id_;
  int32_t block_size_;
  int32_t num_blocks_;
  int32_t num_layers_;
  int32_t num_kv_heads_;
  int32_t head_dim_;
  Backend* backend_;
  DType dtype_;
  absl::Status status_;
  int64_t layer_stride_;     // bytes per layer for K (and again for V)
  // [num_layers, 2 (K, V), num_blocks, block_size * num_kv_heads * head_dim] elements of dtype_
  // (as floats, for the alignment); a block's order is the backend's (PagedKvLayer).
  std::vector<float> host_;
  BackendBuffer pool_;       // the same layout in the backend's memory and dtype
  char* base_ = nullptr;     // host_ or pool_
};

// A free list of block ids.
class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);
  // ResourceExhausted when the pool is empty.
  absl::StatusOr<BlockId> Allocate();
  void Free(BlockId id);
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

 private:
  std::vector<BlockId> free_;
};

// The block table of one sequence, grown on demand. Positions can be cut back (a watermark); the
// blocks then stay owned and their slots are overwritten by the next tokens.
class SequenceBlocks {
 public:
  SequenceBlocks(BlockAllocator* allocator, int32_t block_size)
      : allocator_(allocator), block_size_(block_size) {}
  ~SequenceBlocks();
  SequenceBlocks(const SequenceBlocks&) = delete;
  SequenceBlocks& operator=(const SequenceBlocks&) = delete;

  // Makes sure slots [0, num_tokens) have blocks.
  absl::Status Reserve(int32_t num_tokens);
  // Returns the blocks past `num_tokens` to the allocator.
  void Truncate(int32_t num_tokens);
  const std::vector<BlockId>& table() const { return table_; }

 private:
  BlockAllocator* allocator_;
  int32_t block_size_;
  std::vector<BlockId> table_;
};

}  // namespace specula
