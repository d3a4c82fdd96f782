// How long one forward pass of a model takes, by the work it does: the measurements behind the
// engine's step cost model (adaptive speculation, engine/step_cost.h). The work of a forward is
// counted in floating-point operations from the model's shape, so that a prefill chunk, a
// verification run and a batch of decodes are points on one axis.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_model.h"
#include "model/model_config.h"

namespace specula {

// FLOPs of one forward over `tokens` new tokens with `rows` logits rows, the tokens attending to
// `positions` positions in all (summed over the tokens): the matrix products of every layer per
// token, the classifier per row, and the attention's two products per position.
double ForwardFlops(const ModelConfig& c, double tokens, double rows, double positions);

// Positions attended by n new tokens at positions first .. first + n - 1, summed: each attends to
// its own position and those before it.
inline double AttendedPositions(double first, double n) { return n <= 0 ? 0.0 : n * (first + 1) + 0.5 * n * (n - 1); }

// One measured forward.
struct CostPoint {
  double flops = 0;
  double seconds = 0;
  int32_t tokens = 0;  // new tokens of the forward (0 where the point did not come from a measurement)
};

struct CostGrid {
  int32_t batch = 8;            // the measured forwards spread their tokens over this many sequences
  int32_t block_size = 16;
  double budget_seconds = 1.0;  // stop measuring past this
  int32_t max_tokens = 512;     // the largest forward to measure (at most 512)
};

// Times forwards of 1, 2, 4, ... up to grid.max_tokens new tokens, each with its logits row
// (decodes and verification runs), spread over up to `batch` sequences at short contexts, the best
// of a few runs each, until the budget is spent. A model's points are kept for the process's
// lifetime by (model, KV dtype, batch, block size): a call measures only the shapes past those
// already measured, so an engine can measure its small shapes at startup and the larger ones later
// (engine/engine.h), and engines built one after another on the same model measure once. Returns
// every point measured so far, in order of work. The forwards write into a KV pool of their own (an
// engine's pool pre-touched this way made its later steps measurably slower). Errors: the pool
// cannot be allocated, a forward fails.
absl::StatusOr<std::vector<CostPoint>> MeasureForwardCost(LlamaModel& model, const CostGrid& grid);

}  // namespace specula
