// The Llama-family forward pass (RMSNorm, RoPE, GQA attention over the paged KV cache, SwiGLU),
// written once against the Backend op interface: the same code runs on the CPU and CUDA backends.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/batch.h"
#include "core/forward_work.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "kernels/backend.h"

namespace specula {

class Communicator;

enum class LogitsMode {
  kAll,              // one row per new token (prefill scoring, speculative verification)
  kLastPerSequence,  // one row per sequence (plain decoding), all rows for `all_logits` sequences
};

// Tensor parallelism (model/tensor_parallel.h): give each rank its shard of the weights
// (ShardWeights) and the group's communicator. Rank 0 is the model the engine calls: each Forward
// first sends the step plan to the other ranks, which run RunFollower() and compute their share;
// the all-reduces and the logits all-gather happen inside the forward. Rank 0's destructor tells
// them to stop.
class LlamaModel {
 public:
  // Uploads the weights to the backend once. Check status() (or use Create) before Forward.
  LlamaModel(std::unique_ptr<ModelWeights> weights, std::unique_ptr<Backend> backend,
             std::shared_ptr<Communicator> comm = nullptr);
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(std::unique_ptr<ModelWeights> weights,
                                                            std::unique_ptr<Backend> backend,
                                                            std::shared_ptr<Communicator> comm = nullptr);
  ~LlamaModel();

  // This rank's config: under tensor parallelism its own heads, KV heads and hidden units (the KV
  // pools made from it hold this rank's share); vocab_size is always the whole vocabulary.
  const ModelConfig& config() const { return weights_->config; }
  const TpShard& shard() const { return weights_->shard; }
  // Unique to this model for the process's lifetime (never reused, unlike its address).
  uint64_t id() const { return id_; }
  Backend& backend() { return *backend_; }
  const absl::Status& status() const { return status_; }

  // Element type of the KV caches made for this model (the engine's, a proposer's, Generate's):
  // the backend's compute dtype unless set. InvalidArgument when the backend cannot store it.
  DType kv_dtype() const { return kv_dtype_; }
  absl::Status set_kv_dtype(DType d);

  // Runs one step for a batch of sequences. Writes the new tokens' K/V into `kv` and returns logits
  // in `logits`: [num_tokens or num_seqs, vocab_size], in batch order. Null `logits` leaves them in
  // the backend's memory, in the same layout, for backend_logits() (where logits_stay_in_backend()).
  // Bad input (token id out of range, context overflow, short block table, a KV cache of another
  // backend) is an InvalidArgument error and touches nothing; a backend failure names the op.
  absl::Status Forward(const ForwardBatch& batch, KvCache& kv, LogitsMode mode,
                       std::vector<float>* logits);
  // The last Forward's logits when it was given none: [rows, vocab_size] f32 in backend memory,
  // valid until the next Forward. On a device that Forward returns before they are computed: the
  // next op on the backend's stream reads them in order, and Sync() waits for them (and reports a
  // failure of the forward). A device under tensor parallelism gathers them on the host, so
  // there they never stay.
  bool logits_stay_in_backend() const { return !(tp() && backend_->on_device()); }
  const float* backend_logits() const {
    return backend_->on_device() ? logits_dev_.as<float>() : own_logits_.data();
  }

  // Steps of up to this many sequences, each of at most 16 tokens (decode, verification of up to
  // 15 drafts, a draft's catch-up), replay captured graphs on backends that support them, keyed by
  // (batch bucket, tokens per sequence, whether every row's logits are computed); 0 turns graphs
  // off.
  void set_max_graph_batch(int32_t n) { max_graph_batch_ = n; }

  // Sizes the step scratch for up to `tokens` tokens over `seqs` sequences with `table_len` block
  // ids in all and `rows` logits rows (Forward grows it on demand; calling this first keeps
  // allocation out of the step loop and lets the KV pool be sized from what is left). Drops
  // captured graphs when it grows.
  absl::Status Reserve(int32_t tokens, int32_t seqs, int32_t table_len, int32_t rows);

  // The loop of ranks other than 0: receives each step plan and runs this rank's share of the
  // forward, until rank 0 says stop (OK) or a collective fails (its error).
  absl::Status RunFollower();

  // This model's forwards measured so far (model/forward_cost.h), by the grid they were measured
  // on, so that engines built one after another on the model measure once. The caller holds the
  // lock while it reads or writes the points.
  struct MeasuredCost {
    std::mutex mu;
    std::map<std::tuple<int, int32_t, int32_t>, std::vector<CostPoint>> points;  // (KV dtype, batch, block size)
    std::shared_ptr<CostStore> store;  // or null: the points die with the model
  };
  MeasuredCost& measured_cost() { return measured_cost_; }

 private:
  // Pools rank 0 dropped since its last message (filled from KvCache destructors).
  struct ReleasedPools {
    std::mutex mu;
    std::vector<uint64_t> ids;
  };

  // A step replayed from a captured graph: the batch padded to `seqs` sequences (0: no graph) of
  // `tokens` tokens each; `all_rows`: every token's logits are computed (some sequence wants its own).
  struct GraphShape {
    int32_t seqs = 0;
    int32_t tokens = 1;
    bool all_rows = false;
    int64_t key() const { return seqs | (int64_t{tokens} << 16) | (int64_t{all_rows} << 32); }
  };

  bool tp() const { return comm_ != nullptr && weights_->shard.active(); }
  GraphShape GraphShapeOf(const ForwardBatch& batch, LogitsMode mode) const;
  int32_t Flatten(const ForwardBatch& batch, const KvCache& kv, LogitsMode mode, const GraphShape& g, int32_t T,
                  int32_t S, int32_t max_blocks);
  absl::Status SendStep(const ForwardBatch& batch, const KvCache& kv, LogitsMode mode);
  absl::Status ForwardLocal(const ForwardBatch& batch, KvCache& kv, LogitsMode mode, std::vector<float>* logits);
  // Sums a row-parallel product over the ranks (the first failure is kept in tp_status_).
  void AllReduce(void* x, int64_t n, int32_t layer, const char* what);
  // The classifier over final_ [rows, dim] into logits [rows, vocab] (host) or logits_dev_.
  void Classify(int32_t rows, float* logits_out, std::vector<float>* logits);

  // Weight views in the backend's memory and dtype.
  struct Layer {
    const void *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
  };

  absl::Status Upload();
  absl::Status Validate(const ForwardBatch& batch, const KvCache& kv) const;
  // Embedding, layers and final norm + classifier over the scratch buffers: the part a graph
  // captures. Reads metadata from the device copies, writes logits_dev_ [rows, vocab].
  void Run(int32_t T, int32_t S, int32_t rows, int32_t max_blocks, KvCache& kv);

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
  DType kv_dtype_;
  absl::Status status_;
  std::vector<Layer> layers_;
  const void *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  BackendBuffer cos_sin_;  // [max_seq_len, head_dim] f32 RoPE cos | sin per position

  // Host copies of the step's metadata.
  std::vector<int32_t> token_ids_, positions_, slots_, query_start_, tables_, out_rows_;

  // Backend scratch, grown to the largest step seen and reused (no allocation in steady state).
  int32_t cap_tokens_ = 0, cap_seqs_ = 0, cap_table_ = 0, cap_rows_ = 0;
  // The step's metadata in one buffer, copied in at once: ids [T], positions [T], slots [T],
  // query starts [S + 1], block tables [S, max_blocks], rows whose logits are computed [rows], all
  // i32 and packed in that order (a graph's shape fixes the offsets it captured).
  BackendBuffer meta_dev_;
  std::vector<int32_t> meta_;  // the same on the host
  struct StepMeta {
    const int32_t *ids, *positions, *slots, *query_start, *tables, *rows;
  };
  StepMeta dev_meta_{};  // this step's arrays in meta_dev_
  // Packs the host arrays into meta_, copies it in and points dev_meta_ at the copy.
  void CopyMetaIn();
  BackendBuffer x_;           // [T, dim] residual stream
  BackendBuffer xn_;          // [T, dim] normed
  BackendBuffer q_;           // [T, num_heads * head_dim]
  BackendBuffer k_;           // [T, num_kv_heads * head_dim]
  BackendBuffer v_;           // [T, num_kv_heads * head_dim]
  BackendBuffer attn_;        // [T, num_heads * head_dim]
  BackendBuffer proj_;        // [T, dim]
  BackendBuffer gate_;        // [T, hidden_dim]
  BackendBuffer up_;          // [T, hidden_dim]
  BackendBuffer final_;       // [rows, dim]
  BackendBuffer logits_dev_;  // [rows, vocab] f32 (device backends)
  std::vector<float> own_logits_;  // [rows, vocab] host backends' logits when Forward was given none

  // Tensor parallelism.
  std::shared_ptr<Communicator> comm_;
  absl::Status tp_status_;
  std::set<uint64_t> announced_pools_;                      // rank 0: pools the others hold
  std::shared_ptr<ReleasedPools> released_ = std::make_shared<ReleasedPools>();
  std::map<uint64_t, std::unique_ptr<KvCache>> pools_;      // other ranks: rank 0's pool id -> share
  BackendBuffer tp_local_;                                  // [rows, vocab_stride] f32 this rank's logits
  BackendBuffer tp_gather_;                                 // [size, rows, vocab_stride] f32 all of them
  std::vector<float> tp_gather_host_;                       // the same on the host (device backends)

  int32_t max_graph_batch_ = 64;
  MeasuredCost measured_cost_;
  uint64_t id_;
  uint64_t graph_kv_ = 0;  // KvCache::id() of the pool the captured graphs write into
};

}  // namespace specula
