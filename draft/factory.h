// One factory per proposer (--spec-method): n-gram lookup, suffix decoding, a draft model, and the target's own
// layer-skip and self-quant drafts. The proposers with a model own it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "draft/proposer.h"
#include "kernels/make_backend.h"

namespace specula {

// Where a draft model runs: its backend, the KV dtype (the target's), the KV block size, and the
// vocabulary it must share with the target.
struct DraftRuntime {
  BackendSpec backend;
  DType kv_dtype = DType::kF32;
  int32_t block_size = 16;
  int32_t vocab_size = 0;
  // Where the draft's measured forward costs outlive the process (spec/cost_cache.h), or null.
  std::shared_ptr<CostStore> cost_store;
};

absl::StatusOr<std::unique_ptr<Proposer>> MakeNgramProposer(int32_t min_n, int32_t max_n);
// --suffix-max-depth in [1, 1024], --suffix-cache-tokens >= 0, --suffix-min-prob in [0, 1].
absl::Status CheckSuffixOptions(int32_t max_depth, int64_t cache_tokens, float min_prob);
// Suffix decoding (draft/suffix_proposer.h) with a shared cache of `cache_tokens` tokens.
absl::StatusOr<std::unique_ptr<Proposer>> MakeSuffixProposer(int32_t max_depth, int64_t cache_tokens, float min_prob);
// A smaller model's file (a GGUF file, llama2.c .bin or HF directory).
absl::StatusOr<std::unique_ptr<Proposer>> MakeDraftModelProposer(const std::string& path, const DraftRuntime& rt);
// The target's first `num_layers` layers (draft/self_draft.h).
absl::StatusOr<std::unique_ptr<Proposer>> MakeLayerSkipProposer(const std::string& target_path, int32_t num_layers,
                                                                 const DraftRuntime& rt);
// The target's weights requantized to `quant_type` (q4_0, q4_1 or q8_0).
absl::StatusOr<std::unique_ptr<Proposer>> MakeSelfQuantProposer(const std::string& target_path,
                                                                 const std::string& quant_type, const DraftRuntime& rt);

}  // namespace specula
