// Tensor parallelism, Megatron style: how one rank's share of the target is cut, and the cutting.
//
// - Q, K, V, gate and up are column-parallel (this rank's rows of the weight matrices): each rank
//   computes its own attention heads and its own slice of the SwiGLU hidden units.
// - o_proj and down are row-parallel (this rank's columns): each rank's product is a partial sum
//   of the full one, and one all-reduce per block adds them up (two per layer).
// - The classifier is vocab-parallel: each rank computes the logits of its slice of the vocabulary
//   and an all-gather assembles them. Replicating it would leave the other ranks idle during the
//   largest product of the small models (32000 x 288 against 6 layers of 1.3M in stories15m).
// - Heads are split contiguously, as evenly as possible. A KV head whose query heads fall on two
//   ranks is computed on both (replicated, as vLLM does when TP exceeds the KV heads); where the
//   query heads a rank owns do not share their KV heads evenly (9 heads over 3 KV heads at TP = 2),
//   the rank computes the KV heads' whole groups and gives the heads it does not own zero columns
//   in o_proj, so that every head is added once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/batch.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "model/model_config.h"

namespace specula {

struct ModelWeights;

struct TpShard {
  int32_t rank = 0;
  int32_t size = 1;
  int32_t q_begin = 0, q_end = 0;        // query heads this rank computes (global ids)
  int32_t own_begin = 0, own_end = 0;    // of those, the ones it adds to o_proj's all-reduce
  int32_t kv_begin = 0, kv_end = 0;      // KV heads it computes and stores
  int32_t hidden_begin = 0, hidden_end = 0;  // SwiGLU hidden units
  int32_t vocab_begin = 0, vocab_end = 0;    // classifier rows
  int32_t vocab_stride = 0;              // rows per rank in the logits all-gather (the largest slice)

  bool active() const { return size > 1; }
};

// The shard of `rank` in a group of `size`, for a model whose o_proj and down matrices are stored
// in `wo_type` and `down_type` (their columns are cut on block boundaries). InvalidArgument, with
// the numbers, when the model cannot be cut that way: more ranks than heads, than hidden blocks or
// than vocabulary rows, or column cuts that fall inside a quantization block.
absl::StatusOr<TpShard> PlanShard(const ModelConfig& c, int32_t size, int32_t rank, QuantType wo_type = QuantType::kF32,
                                  QuantType down_type = QuantType::kF32);

// Cuts `w` (a whole model as loaded) to `shard` in place. Row cuts are views into the mapped file,
// so the rank touches only its own rows; column cuts (o_proj, down) are copies of this rank's
// columns. The config becomes the rank's: its heads, KV heads and hidden units; vocab_size stays
// the whole vocabulary (the embedding is replicated), while the classifier holds
// vocab_end - vocab_begin rows.
absl::Status ShardWeights(ModelWeights& w, const TpShard& shard);

// What rank 0 sends the other ranks before each forward of the target: the step plan (sequences,
// tokens, positions, block tables), the KV pool it writes into (created on first sight with the
// same geometry, holding the rank's own heads), and the pools dropped since the last message.
struct StepMessage {
  enum Op : uint8_t { kForward = 1, kStop = 2 };
  Op op = kStop;
  std::vector<uint64_t> released_pools;
  uint64_t pool_id = 0;
  int32_t block_size = 0, num_blocks = 0;
  DType kv_dtype = DType::kF32;
  uint8_t logits_mode = 0;
  std::vector<int32_t> start_pos;            // [num_seqs]
  std::vector<uint8_t> all_logits;           // [num_seqs]
  std::vector<std::vector<TokenId>> tokens;  // [num_seqs][num_new]
  std::vector<std::vector<BlockId>> tables;  // [num_seqs][blocks]

  // Views of the vectors above (valid while this message lives).
  ForwardBatch Batch() const;
};

std::string EncodeStepMessage(const StepMessage& m);
// Fills `m` from EncodeStepMessage's bytes (the same bounds checked as any input).
absl::Status DecodeStepMessage(const std::string& bytes, StepMessage* m);
// A forward message for `batch` (the other fields are the caller's).
StepMessage ForwardMessage(const ForwardBatch& batch);

}  // namespace specula
