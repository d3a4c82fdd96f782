// The work of one forward pass, in floating-point operations from the model's shape: the axis on
// which adaptive speculation's step-cost tables (spec/) place a prefill chunk, a verification run
// and a batch of decodes. Here, below model/ and spec/, so that the controller and a simulator price
// steps without a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specula {

// What of a model's shape its forward's work depends on (model/forward_cost.h: ShapeOf).
struct ForwardShape {
  double dim = 0, q_dim = 0, kv_dim = 0, hidden_dim = 0;
  double head_dim = 0, num_heads = 0, num_layers = 0, vocab_size = 0;
};

// FLOPs of one forward over `tokens` new tokens with `rows` logits rows, the tokens attending to
// `positions` positions in all (summed over the tokens): the matrix products of every layer per
// token, the classifier per row, and the attention's two products per position.
inline double ForwardFlops(const ForwardShape& s, double tokens, double rows, double positions) {
  const double per_token = 2.0 * (s.dim * (s.q_dim + 2 * s.kv_dim) + s.q_dim * s.dim + 3 * s.dim * s.hidden_dim);
  const double per_position = 4.0 * s.head_dim * s.num_heads;  // q.k and p.v, every head
  return s.num_layers * (tokens * per_token + positions * per_position) + rows * 2.0 * s.dim * s.vocab_size;
}

// Positions attended by n new tokens at positions first .. first + n - 1, summed: each attends to
// its own position and those before it.
inline double AttendedPositions(double first, double n) { return n <= 0 ? 0.0 : n * (first + 1) + 0.5 * n * (n - 1); }

// One measured forward.
struct CostPoint {
  double flops = 0;
  double seconds = 0;
  int32_t tokens = 0;  // new tokens of the forward (0 where the point did not come from a measurement)
};

// The forwards to measure: 1, 2, 4, ... up to max_tokens new tokens.
struct CostGrid {
  int32_t batch = 8;            // the measured forwards spread their tokens over this many sequences
  int32_t block_size = 16;
  double budget_seconds = 1.0;  // stop measuring past this
  int32_t max_tokens = 512;     // the largest forward to measure (at most 512)
};

// Where measured tables outlive the process (spec/cost_cache.h: a JSON file per model, machine and
// build). `table` names the conditions of the measurement (KV dtype, batch, block size).
class CostStore {
 public:
  virtual ~CostStore() = default;
  virtual std::vector<CostPoint> Get(const std::string& table) const = 0;  // empty: none stored
  virtual void Put(const std::string& table, const std::vector<CostPoint>& points) = 0;
};

}  // namespace specula
