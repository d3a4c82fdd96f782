// The plain reference that engine tests compare against: one prompt through a one-sequence engine
// (no speculation), stopping only at the given stop ids or the length limit.
#pragma once

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "core/status_macros.h"
#include "engine/engine.h"
#include "engine/run.h"

namespace specula {

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<TokenId> stop_ids;  // generation ends after emitting one of these
  int32_t block_size = 16;
};

struct GenerateResult {
  std::vector<TokenId> tokens;  // generated, stop token included
  bool stopped = false;         // a stop token ended generation
};

// Errors: an empty prompt, or one that leaves no room in the model's context.
inline absl::StatusOr<GenerateResult> Generate(LlamaModel& model, absl::Span<const TokenId> prompt,
                                               const GenerateOptions& opt) {
  SchedulerConfig sc;
  sc.max_num_seqs = 1;
  sc.block_size = opt.block_size;
  sc.max_model_len = model.config().max_seq_len;
  const int64_t tokens = std::min<int64_t>(sc.max_model_len, prompt.size() + opt.max_tokens);
  sc.num_blocks = static_cast<int32_t>((tokens + sc.block_size - 1) / sc.block_size) + 1;
  Engine engine(&model, nullptr, sc);
  RETURN_IF_ERROR(engine.Validate());
  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  r.max_tokens = opt.max_tokens;
  r.sampling = opt.sampling;
  r.stop_ids = opt.stop_ids;
  r.ignore_eos = true;  // the stop ids are explicit here
  RETURN_IF_ERROR(engine.AddRequest(std::move(r)));
  ASSIGN_OR_RETURN(std::vector<RequestOutput> out, RunToCompletion(engine));
  if (!out.at(0).error.empty()) return absl::InternalError(out[0].error);
  return GenerateResult{std::move(out[0].tokens), out[0].finish == FinishReason::kStopToken};
}

}  // namespace specula
