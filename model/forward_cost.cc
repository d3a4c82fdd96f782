#include "model/forward_cost.h"

#include <algorithm>
#include <chrono>

#include "core/status_macros.h"

namespace specula {

CostFeatures ForwardFeatures(const std::vector<int32_t>& start, const std::vector<int32_t>& tokens, int32_t rows) {
  CostFeatures x{1.0, 0.0, static_cast<double>(rows), 0.0};
  for (size_t i = 0; i < tokens.size(); ++i) {
    x[1] += tokens[i];
    // Positions start+1 .. start+tokens attended, summed.
    x[3] += (static_cast<double>(tokens[i]) * start[i] + 0.5 * tokens[i] * (tokens[i] + 1.0)) / 1024.0;
  }
  return x;
}

absl::StatusOr<std::vector<CostSample>> MeasureForwardCost(LlamaModel& model, const CostGrid& grid) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const ModelConfig& c = model.config();
  const int32_t bs = grid.block_size, ctx = c.max_seq_len;
  const int32_t batch = std::max(grid.batch, 1);
  const int32_t k1 = std::min(grid.max_spec_tokens + 1, ctx - 1);
  const int32_t prefill = std::min(64, ctx - 1);
  const int32_t long_ctx = std::min(256, ctx - 1);
  // Every sequence gets blocks of its own, so that attention reads as many distinct bytes as a
  // real batch would.
  const int32_t per_seq = (std::max({long_ctx, k1, prefill}) + bs - 1) / bs;
  KvCache kv(c, {bs, batch * per_seq, model.kv_dtype()}, &model.backend());
  RETURN_IF_ERROR(kv.status());
  struct Shape {
    int32_t seqs, tokens, start;
    bool all_logits;
  };
  const Shape shapes[] = {{1, 1, 0, false},     {1, k1, 0, true},     {1, prefill, 0, false},
                          {batch, 1, 0, false}, {batch, 1, long_ctx - 1, false}};
  std::vector<CostSample> out;
  std::vector<TokenId> ids;
  for (const Shape& sh : shapes) {
    if (elapsed() > grid.budget_seconds && out.size() >= 2) break;
    std::vector<std::vector<BlockId>> tables(sh.seqs);
    std::vector<int32_t> starts(sh.seqs, sh.start), counts(sh.seqs, sh.tokens);
    ids.resize(sh.tokens);
    for (int32_t i = 0; i < sh.tokens; ++i) ids[i] = (i * 7 + 3) % c.vocab_size;
    ForwardBatch batch_in;
    for (int32_t s = 0; s < sh.seqs; ++s) {
      for (int32_t b = 0; b < (sh.start + sh.tokens + bs - 1) / bs; ++b) tables[s].push_back(s * per_seq + b);
      batch_in.seqs.push_back({ids, sh.start, tables[s], sh.all_logits});
    }
    std::vector<float> logits;
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {  // the first run warms up (page faults, thread start)
      const auto r0 = Clock::now();
      RETURN_IF_ERROR(model.Forward(batch_in, kv, LogitsMode::kLastPerSequence, &logits));
      if (rep > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - r0).count());
      if (rep >= 1 && elapsed() > grid.budget_seconds) break;
    }
    if (best < 1e30) {
      out.push_back({ForwardFeatures(starts, counts, sh.all_logits ? sh.seqs * sh.tokens : sh.seqs), best});
    }
  }
  return out;
}

}  // namespace specula
