// The engine as one typed struct: the CLI (tools/engine_flags.h), `serve` and the experiment runner
// fill it directly, and LoadEngine (engine/engine_setup.h) builds the engine it describes. Each
// field is a flag of `specula generate --help`; errors name the flag.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/sampler.h"
#include "request/boundary.h"

namespace specula {

// The target model and where it runs.
struct TargetOptions {
  std::string model;               // --model: a GGUF file, llama2.c .bin or HF directory
  std::string tokenizer;           // --tokenizer; empty: the model's own, or one beside it
  std::string device = "cpu";      // --device
  std::string dtype;               // --dtype; empty: the device's default
  std::string quantization = "none";  // --quantization
  bool int8_activations = true;    // false: --two-term-activations
  std::string kv_cache_dtype;      // --kv-cache-dtype; empty: bf16 on cpu, the compute dtype on cuda
  int32_t tensor_parallel_size = 1;    // --tensor-parallel-size
  double collective_timeout_s = 60;    // --collective-timeout-s
  double gpu_memory_utilization = 0.9;  // --gpu-memory-utilization
};

// How drafts are made (draft/factory.h) and how many.
struct SpeculationOptions {
  std::string method = "none";     // --spec-method: none, draft, ngram, suffix, layer-skip or self-quant
  int32_t num_spec_tokens = 4;     // --num-spec-tokens k, or --max-spec-tokens under auto (default 8)
  bool adaptive = false;           // --num-spec-tokens auto
  std::string draft_model;         // --draft-model
  std::string draft_tokenizer;     // --draft-tokenizer; empty: the target's
  std::string draft_quantization = "none";  // --draft-quantization
  int32_t ngram_min = 2, ngram_max = 4;     // --ngram-min, --ngram-max
  int32_t suffix_max_depth = 64;            // --suffix-max-depth
  int64_t suffix_cache_tokens = 1 << 20;    // --suffix-cache-tokens
  float suffix_min_prob = 0.1f;             // --suffix-min-prob
  int32_t draft_layers = 0;                 // --draft-layers; 0: a quarter of the target's
  std::string draft_quant_type = "q4_0";    // --draft-quant-type
  // --grammar-drafts: the most drafts per step a constrained request's grammar forces where the
  // proposer has none (SpecConfig), with any --spec-method, none included; 0: none.
  int32_t grammar_drafts = 8;
  // --cost-cache: the directory where auto's measured step costs are kept across runs
  // (spec/cost_cache.h); empty or "none": measured anew by every engine. The CLI's default is
  // DefaultCostCacheDir().
  std::string cost_cache;
};

// The continuous-batching scheduler and its KV pool.
struct BatchingOptions {
  int32_t max_num_seqs = 64;             // --max-num-seqs
  int32_t max_num_batched_tokens = 2048;  // --max-num-batched-tokens
  int32_t num_blocks = 0;                // --num-blocks; 0: sized from the device (BatchSchedulerConfig)
  double max_wait_ms = 0;                // --max-wait-ms
  bool enable_prefix_caching = true;     // --no-prefix-caching
};

// What a request gets where it does not say.
struct RequestDefaults {
  int32_t max_tokens = kMaxTokensFlagDefault;  // --max-tokens
  SamplingParams sampling;   // --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --seed
  int32_t block_size = 16;   // --block-size (of the KV cache's blocks)
};

struct EngineOptions {
  TargetOptions target;
  SpeculationOptions speculation;
  BatchingOptions batching;
  RequestDefaults defaults;
  bool add_bos = true;      // --no-bos: false (the tokenizer may still add none)
  bool ignore_eos = false;  // --ignore-eos
};

// Every value within its range and every name known, before anything loads; errors name the flag.
absl::Status ValidateEngineOptions(const EngineOptions& o);

// The options as JSON and back: rank 0 of a tensor-parallel experiment sends each point's engine to
// the other ranks this way. Errors: not the JSON of EngineOptions.
std::string EngineOptionsToJson(const EngineOptions& o);
absl::StatusOr<EngineOptions> EngineOptionsFromJson(const std::string& text);

}  // namespace specula
