#include "engine/options.h"

#include "absl/strings/str_cat.h"
#include "core/quant.h"
#include "core/status_macros.h"
#include "draft/factory.h"
#include "kernels/make_backend.h"
#include "nlohmann/json.hpp"

namespace specula {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TargetOptions, model, tokenizer, device, dtype, quantization,
                                                int8_activations, kv_cache_dtype, tensor_parallel_size,
                                                collective_timeout_s, gpu_memory_utilization)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SpeculationOptions, method, num_spec_tokens, adaptive, draft_model,
                                                draft_tokenizer, draft_quantization, ngram_min, ngram_max,
                                                suffix_max_depth, suffix_cache_tokens, suffix_min_prob,
                                                draft_layers, draft_quant_type, grammar_drafts, cost_cache)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BatchingOptions, max_num_seqs, max_num_batched_tokens, num_blocks,
                                                max_wait_ms, enable_prefix_caching)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SamplingParams, temperature, top_k, top_p, min_p, repetition_penalty,
                                                seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RequestDefaults, max_tokens, sampling, block_size)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EngineOptions, target, speculation, batching, defaults, add_bos,
                                                ignore_eos)

namespace {

absl::Status ValidateTarget(const TargetOptions& t) {
  if (t.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (t.tensor_parallel_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size must be at least 1, got ", t.tensor_parallel_size));
  }
  if (!(t.collective_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--collective-timeout-s must be positive, got ", t.collective_timeout_s));
  }
  RETURN_IF_ERROR(CheckQuantization("--quantization", t.quantization, t.device));
  if (!(t.gpu_memory_utilization > 0.0 && t.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", t.gpu_memory_utilization));
  }
  if (!t.kv_cache_dtype.empty() && t.kv_cache_dtype != "f32" && t.kv_cache_dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: '", t.kv_cache_dtype, "' is not f32 or bf16"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSpeculation(const SpeculationOptions& s, const std::string& device) {
  RETURN_IF_ERROR(CheckQuantization("--draft-quantization", s.draft_quantization, device));
  if (s.grammar_drafts < 0 || s.grammar_drafts > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--grammar-drafts must be in [0, 64], got ", s.grammar_drafts));
  }
  if (s.method == "none") return absl::OkStatus();
  if (s.method == "synthetic") {
    return absl::InvalidArgumentError(
        "--spec-method synthetic is not lossless: it is only available in benchmarks and experiments");
  }
  if (s.method != "draft" && s.method != "ngram" && s.method != "suffix" && s.method != "layer-skip" &&
      s.method != "self-quant") {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec-method: '", s.method, "' is not none, draft, ngram, suffix, layer-skip or self-quant"));
  }
  if (s.num_spec_tokens <= 0 || s.num_spec_tokens > 64) {
    return absl::InvalidArgumentError(absl::StrCat(s.adaptive ? "--max-spec-tokens" : "--num-spec-tokens",
                                                   " must be in [1, 64], got ", s.num_spec_tokens));
  }
  if (s.method == "ngram" && (s.ngram_min < 1 || s.ngram_max < s.ngram_min)) {
    return absl::InvalidArgumentError("--ngram-min/--ngram-max: need 1 <= min <= max");
  }
  if (s.method == "suffix") RETURN_IF_ERROR(CheckSuffixOptions(s.suffix_max_depth, s.suffix_cache_tokens, s.suffix_min_prob));
  if (s.method == "draft" && s.draft_model.empty()) {
    return absl::InvalidArgumentError("--spec-method draft needs --draft-model PATH");
  }
  if (s.method == "layer-skip" && s.draft_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-layers must be positive, got ", s.draft_layers));
  }
  if (s.method == "self-quant") {
    if (auto type = ParseQuantType(s.draft_quant_type); !type.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--draft-quant-type: ", type.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateEngineOptions(const EngineOptions& o) {
  RETURN_IF_ERROR(ValidateTarget(o.target));
  RETURN_IF_ERROR(ValidateSpeculation(o.speculation, o.target.device));
  const RequestDefaults& d = o.defaults;
  if (d.block_size <= 0) return absl::InvalidArgumentError("--block-size must be positive");
  if (d.max_tokens <= 0) return absl::InvalidArgumentError(absl::StrCat("--max-tokens must be positive, got ", d.max_tokens));
  return ValidateSamplingParams(d.sampling);
}

std::string EngineOptionsToJson(const EngineOptions& o) { return nlohmann::json(o).dump(); }

absl::StatusOr<EngineOptions> EngineOptionsFromJson(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("engine options: not a JSON object");
  try {
    return j.get<EngineOptions>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("engine options: ", e.what()));
  }
}

}  // namespace specula
