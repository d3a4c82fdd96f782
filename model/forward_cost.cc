#include "model/forward_cost.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace specula {

ForwardShape ShapeOf(const ModelConfig& c) {
  return {static_cast<double>(c.dim), static_cast<double>(c.q_dim()), static_cast<double>(c.kv_dim()),
          static_cast<double>(c.hidden_dim), static_cast<double>(c.head_dim), static_cast<double>(c.num_heads),
          static_cast<double>(c.num_layers), static_cast<double>(c.vocab_size)};
}

namespace {

// Appends to `out` the shapes of n tokens for n = 1, 2, 4, ... past out's last, up to grid.max_tokens.
absl::Status Measure(LlamaModel& model, const CostGrid& grid, std::vector<CostPoint>* out);

}  // namespace

absl::StatusOr<std::vector<CostPoint>> MeasureForwardCost(LlamaModel& model, const CostGrid& grid) {
  // Each measurement is a few forwards at full load; the engine's factor (spec/step_cost.h) follows
  // later drift.
  LlamaModel::MeasuredCost& measured = model.measured_cost();
  const auto key = std::make_tuple(static_cast<int>(model.kv_dtype()), grid.batch, grid.block_size);
  const std::string table = absl::StrCat("kv=", DTypeName(model.kv_dtype()), " batch=", grid.batch,
                                         " block=", grid.block_size);
  std::vector<CostPoint> points;
  {
    std::lock_guard<std::mutex> lock(measured.mu);
    if (auto it = measured.points.find(key); it != measured.points.end()) {
      points = it->second;
    } else if (measured.store != nullptr) {  // another process measured this model here
      points = measured.points[key] = measured.store->Get(table);
    }
  }
  const size_t had = points.size();
  RETURN_IF_ERROR(Measure(model, grid, &points));
  if (points.size() > had) {
    std::lock_guard<std::mutex> lock(measured.mu);
    std::vector<CostPoint>& kept = measured.points[key];
    if (kept.size() < points.size()) {
      kept = points;
      if (measured.store != nullptr) measured.store->Put(table, kept);
    }
  }
  return points;
}

namespace {

// Shapes of up to this many tokens a sequence are timed as verifications (a logits row a token):
// --max-spec-tokens' default of 8 verifies 9; past 16 a sequence's tokens are priced as a prefill.
constexpr int32_t kVerifyTokens = 16;

absl::Status Measure(LlamaModel& model, const CostGrid& grid, std::vector<CostPoint>* out) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const ModelConfig& c = model.config();
  const int32_t bs = grid.block_size, batch = std::max(grid.batch, 1);
  constexpr int32_t kStart = 32;  // a short context: the tokens sit at positions 32, 33, ...
  const int32_t max_tokens = std::min({512, grid.max_tokens, batch * (c.max_seq_len - kStart - 1)});
  const int32_t first = out->empty() ? 1 : 2 * out->back().tokens;
  if (first > max_tokens) return absl::OkStatus();
  const int32_t per_seq_max = (max_tokens + batch - 1) / batch;
  const int32_t blocks_per_seq = (kStart + per_seq_max + bs - 1) / bs;
  KvCache kv(c, {bs, batch * blocks_per_seq, model.kv_dtype()}, &model.backend());
  RETURN_IF_ERROR(kv.status());
  std::vector<std::vector<BlockId>> tables(batch);
  for (int32_t s = 0; s < batch; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b) tables[s].push_back(s * blocks_per_seq + b);
  }
  // The context the timed tokens attend to (positions [0, kStart)) is never written: zero it, so that
  // attention reads zeros rather than whatever the memory held (NaN scores, seen as undefined
  // behaviour under UBSan). Other TP ranks' pools are not reached from here; ExpApprox tolerates NaN.
  const PagedKvLayer first_layer = kv.Layer(0);
  const int64_t block_bytes =
      static_cast<int64_t>(bs) * first_layer.num_kv_heads * first_layer.head_dim * DTypeBytes(first_layer.dtype);
  const std::vector<char> zeros(block_bytes * std::min(blocks_per_seq, (kStart + bs - 1) / bs), 0);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const PagedKvLayer layer = kv.Layer(l);
    for (int32_t s = 0; s < batch; ++s) {
      const int64_t off = static_cast<int64_t>(s) * blocks_per_seq * block_bytes;
      model.backend().CopyIn(static_cast<char*>(layer.k) + off, zeros.data(), zeros.size());
      model.backend().CopyIn(static_cast<char*>(layer.v) + off, zeros.data(), zeros.size());
    }
  }
  std::vector<TokenId> ids(per_seq_max);
  for (int32_t i = 0; i < per_seq_max; ++i) ids[i] = (i * 7 + 3) % c.vocab_size;
  // On a device the step's logits stay there (verification runs there too): so do these.
  std::vector<float> host_logits;
  std::vector<float>* logits = model.backend().on_device() && model.logits_stay_in_backend() ? nullptr : &host_logits;
  double last = out->empty() ? 0.0 : out->back().seconds;  // seconds of the last shape measured
  for (int32_t n = first; n <= max_tokens; n *= 2) {
    // Stop before a shape that would run past the budget (its time is about twice the last one's).
    if (last > 0 && elapsed() + 3 * 2 * last > grid.budget_seconds) break;
    const int32_t seqs = std::min(n, batch), per_seq = (n + seqs - 1) / seqs;
    // A verification computes a logits row per token, a prefill chunk one per sequence: up to
    // kVerifyTokens tokens a sequence the shape is timed as the former, past it as the latter, and
    // its work counts the rows it computed. (Timed with one row a sequence and counted with a row a
    // token, the table priced SmolLM2 Q4_1's 5-token verification at 1.2-1.3x its 1-token step
    // where it ran at 1.6-1.9x: the classifier is a fifth of a token's weights.)
    const bool verify = per_seq <= kVerifyTokens;
    const int32_t rows = verify ? seqs * per_seq : seqs;
    ForwardBatch in;
    double positions = 0;
    for (int32_t s = 0; s < seqs; ++s) {
      in.seqs.push_back({absl::MakeConstSpan(ids).subspan(0, per_seq), kStart, tables[s], true});
      positions += AttendedPositions(kStart, per_seq);
    }
    // Two timed runs each, after one that warms up: a shape's first run touches memory not used
    // before (its logits rows, the pool's blocks past the context; the model's first run its
    // threads too). With that run timed, a stories15m-shape forward of 16 tokens over 8 sequences
    // measured 3.1-3.6 ms against 2.1-2.6 ms after (8 tokens: 1.8-2.3), and the table priced a
    // batch of 8 with one draft each at 1.6x a plain step where it ran at 1.2x: auto drafted on
    // no step in some runs where k = 1 gained 1.2x.
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto r0 = Clock::now();
      RETURN_IF_ERROR(model.Forward(in, kv, verify ? LogitsMode::kAll : LogitsMode::kLastPerSequence, logits));
      if (logits == nullptr) RETURN_IF_ERROR(model.backend().Sync());  // the forward returned before it ran
      const double s = std::chrono::duration<double>(Clock::now() - r0).count();
      if (rep > 0) best = std::min(best, s);
    }
    last = best;
    out->push_back({ForwardFlops(c, seqs * per_seq, rows, positions), best, seqs * per_seq});
  }
  return absl::OkStatus();
}

}  // namespace

}  // namespace specula
