#include "engine/generate.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace specula {

absl::StatusOr<GenerateResult> Generate(LlamaModel& model, absl::Span<const TokenId> prompt,
                                        const GenerateOptions& options,
                                        const std::function<void(TokenId)>& on_token) {
  const ModelConfig& c = model.config();
  RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) >= c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt.size(),
                                                   " tokens is longer than the context of ",
                                                   c.max_seq_len, " tokens (max_seq_len)"));
  }
  if (options.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must be >= 0");
  const int32_t total =
      std::min<int64_t>(c.max_seq_len, static_cast<int64_t>(prompt.size()) + options.max_tokens);
  KvCache kv(c, {options.block_size, (total + options.block_size - 1) / options.block_size, model.kv_dtype()},
             &model.backend());
  RETURN_IF_ERROR(kv.status());
  BlockAllocator allocator(kv.num_blocks());
  SequenceBlocks blocks(&allocator, options.block_size);
  Sampler sampler(options.sampling);
  GenerateResult r;
  r.prompt_tokens = static_cast<int32_t>(prompt.size());
  std::vector<TokenId> history(prompt.begin(), prompt.end());
  std::vector<float> logits;  // [1, vocab]
  using Clock = std::chrono::steady_clock;

  auto t0 = Clock::now();
  for (size_t pos = 0; pos < prompt.size(); pos += options.prefill_chunk) {
    const size_t n = std::min<size_t>(options.prefill_chunk, prompt.size() - pos);
    RETURN_IF_ERROR(blocks.Reserve(static_cast<int32_t>(pos + n)));
    ForwardBatch batch;
    batch.seqs.push_back({prompt.subspan(pos, n), static_cast<int32_t>(pos), blocks.table()});
    RETURN_IF_ERROR(model.Forward(batch, kv, LogitsMode::kLastPerSequence, &logits));
  }
  auto t1 = Clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  while (static_cast<int32_t>(history.size()) < total) {
    const TokenId next = sampler.Sample(logits, history);
    r.tokens.push_back(next);
    history.push_back(next);
    if (on_token) on_token(next);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) {
      r.stopped = true;
      break;
    }
    if (static_cast<int32_t>(history.size()) >= total) break;
    const int32_t pos = static_cast<int32_t>(history.size()) - 1;
    RETURN_IF_ERROR(blocks.Reserve(pos + 1));
    ForwardBatch batch;
    batch.seqs.push_back({absl::MakeConstSpan(&history[pos], 1), pos, blocks.table()});
    RETURN_IF_ERROR(model.Forward(batch, kv, LogitsMode::kLastPerSequence, &logits));
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return r;
}

}  // namespace specula
