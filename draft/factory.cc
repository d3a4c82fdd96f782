#include "draft/factory.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "draft/draft_model_proposer.h"
#include "draft/ngram_proposer.h"
#include "draft/self_draft.h"
#include "draft/suffix_proposer.h"
#include "model/llama_model.h"

namespace specula {
namespace {

// A draft model from its weights (`path` names them in errors), with a KV pool of 64 full contexts.
absl::StatusOr<std::unique_ptr<Proposer>> FromWeights(const std::string& path,
                                                      absl::StatusOr<std::unique_ptr<ModelWeights>> weights,
                                                      const DraftRuntime& rt) {
  if (!weights.ok()) return weights.status();
  if ((*weights)->config.vocab_size != rt.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the draft's vocabulary (", (*weights)->config.vocab_size,
                                                   " tokens) is incompatible with the target's (", rt.vocab_size, ")"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(rt.backend));
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(std::move(weights).value(), std::move(backend)));
  RETURN_IF_ERROR(model->set_kv_dtype(rt.kv_dtype));
  model->measured_cost().store = rt.cost_store;
  const int32_t blocks = 64 * ((model->config().max_seq_len + rt.block_size - 1) / rt.block_size);
  return std::make_unique<DraftModelProposer>(std::move(model), rt.block_size, blocks);
}

}  // namespace

absl::Status CheckSuffixOptions(int32_t max_depth, int64_t cache_tokens, float min_prob) {
  if (max_depth < 1 || max_depth > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--suffix-max-depth must be in [1, 1024], got ", max_depth));
  }
  if (cache_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--suffix-cache-tokens must be >= 0, got ", cache_tokens));
  }
  if (!(min_prob >= 0.0f && min_prob <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("--suffix-min-prob must be in [0, 1], got ", min_prob));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeNgramProposer(int32_t min_n, int32_t max_n) {
  if (min_n < 1 || max_n < min_n) return absl::InvalidArgumentError("--ngram-min/--ngram-max: need 1 <= min <= max");
  return std::make_unique<NgramProposer>(min_n, max_n);
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeSuffixProposer(int32_t max_depth, int64_t cache_tokens, float min_prob) {
  RETURN_IF_ERROR(CheckSuffixOptions(max_depth, cache_tokens, min_prob));
  SuffixParams p;
  p.max_depth = max_depth;
  p.min_prob = min_prob;
  return std::make_unique<SuffixProposer>(p, cache_tokens);
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeDraftModelProposer(const std::string& path, const DraftRuntime& rt) {
  return FromWeights(path, LoadModel(path), rt);
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeLayerSkipProposer(const std::string& target_path, int32_t num_layers,
                                                                 const DraftRuntime& rt) {
  return FromWeights(target_path, LayerSkipDraftWeights(target_path, num_layers), rt);
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeSelfQuantProposer(const std::string& target_path,
                                                                 const std::string& quant_type, const DraftRuntime& rt) {
  ASSIGN_OR_RETURN(QuantType type, ParseQuantType(quant_type));
  return FromWeights(target_path, SelfQuantDraftWeights(target_path, type), rt);
}

}  // namespace specula
