#include "model/forward_cost.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "core/status_macros.h"

namespace specula {

double ForwardFlops(const ModelConfig& c, double tokens, double rows, double positions) {
  const double dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim;
  const double per_token = 2.0 * (dim * (q + 2 * kv) + q * dim + 3 * dim * hidden);  // Q/K/V, O, gate/up/down
  const double per_position = 4.0 * c.head_dim * c.num_heads;                        // q.k and p.v, every head
  return c.num_layers * (tokens * per_token + positions * per_position) + rows * 2.0 * dim * c.vocab_size;
}

namespace {

// Measurements by (model id, KV dtype, batch, block size): engines built one after another on the
// same model (a benchmark's runs, a server rebuilding its engine) measure once: each measurement is
// up to a second of full load. The engine's factor (engine/step_cost.h) follows later drift.
struct CacheKey {
  uint64_t model;
  int kv_dtype;
  int32_t batch, block_size;
  auto operator<=>(const CacheKey&) const = default;
};
std::mutex cache_mu;
std::map<CacheKey, std::vector<CostPoint>>& Cache() {
  static auto* cache = new std::map<CacheKey, std::vector<CostPoint>>;
  return *cache;
}

absl::StatusOr<std::vector<CostPoint>> Measure(LlamaModel& model, const CostGrid& grid);

}  // namespace

absl::StatusOr<std::vector<CostPoint>> MeasureForwardCost(LlamaModel& model, const CostGrid& grid) {
  const CacheKey key{model.id(), static_cast<int>(model.kv_dtype()), grid.batch, grid.block_size};
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (auto it = Cache().find(key); it != Cache().end()) return it->second;
  }
  auto points = Measure(model, grid);
  if (points.ok() && !points->empty()) {
    std::lock_guard<std::mutex> lock(cache_mu);
    Cache()[key] = *points;
  }
  return points;
}

namespace {

absl::StatusOr<std::vector<CostPoint>> Measure(LlamaModel& model, const CostGrid& grid) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const ModelConfig& c = model.config();
  const int32_t bs = grid.block_size, batch = std::max(grid.batch, 1);
  constexpr int32_t kStart = 32;  // a short context: the tokens sit at positions 32, 33, ...
  const int32_t max_tokens = std::min(512, batch * (c.max_seq_len - kStart - 1));
  if (max_tokens < 1) return std::vector<CostPoint>{};
  const int32_t per_seq_max = (max_tokens + batch - 1) / batch;
  const int32_t blocks_per_seq = (kStart + per_seq_max + bs - 1) / bs;
  KvCache kv(c, {bs, batch * blocks_per_seq, model.kv_dtype()}, &model.backend());
  RETURN_IF_ERROR(kv.status());
  std::vector<std::vector<BlockId>> tables(batch);
  for (int32_t s = 0; s < batch; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b) tables[s].push_back(s * blocks_per_seq + b);
  }
  std::vector<TokenId> ids(per_seq_max);
  for (int32_t i = 0; i < per_seq_max; ++i) ids[i] = (i * 7 + 3) % c.vocab_size;
  std::vector<CostPoint> out;
  std::vector<float> logits;
  double last = 0;  // seconds of the last shape measured
  for (int32_t n = 1; n <= max_tokens; n *= 2) {
    // Stop before a shape that would run past the budget (its time is about twice the last one's).
    if (!out.empty() && elapsed() + 3 * 2 * last > grid.budget_seconds) break;
    const int32_t seqs = std::min(n, batch), per_seq = (n + seqs - 1) / seqs;
    ForwardBatch in;
    double positions = 0;
    for (int32_t s = 0; s < seqs; ++s) {
      in.seqs.push_back({absl::MakeConstSpan(ids).subspan(0, per_seq), kStart, tables[s], true});
      positions += AttendedPositions(kStart, per_seq);
    }
    double best = 1e30;
    for (int rep = 0; rep < (out.empty() ? 4 : 3); ++rep) {  // the very first run warms up (page faults, threads)
      const auto r0 = Clock::now();
      RETURN_IF_ERROR(model.Forward(in, kv, LogitsMode::kLastPerSequence, &logits));
      const double s = std::chrono::duration<double>(Clock::now() - r0).count();
      if (!(out.empty() && rep == 0)) best = std::min(best, s);
    }
    last = best;
    out.push_back({ForwardFlops(c, seqs * per_seq, seqs * per_seq, positions), best});
  }
  return out;
}

}  // namespace

}  // namespace specula
