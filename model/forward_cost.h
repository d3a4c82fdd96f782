// How long one forward pass of a model takes, by the work it does: the measurements behind the
// engine's step cost model (adaptive speculation, spec/step_cost.h). The work of a forward is
// counted in floating-point operations from the model's shape, so that a prefill chunk, a
// verification run and a batch of decodes are points on one axis.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "core/forward_work.h"
#include "model/llama_model.h"
#include "model/model_config.h"

namespace specula {

// The shape that the work of the model's forwards depends on.
ForwardShape ShapeOf(const ModelConfig& c);
inline double ForwardFlops(const ModelConfig& c, double tokens, double rows, double positions) {
  return ForwardFlops(ShapeOf(c), tokens, rows, positions);
}

// Times forwards of 1, 2, 4, ... up to grid.max_tokens new tokens, spread over up to `batch`
// sequences at short contexts, each token with its logits row while a sequence has up to 16 of them
// (decodes and verification runs), past that one row a sequence (prefill chunks), the best
// of a few runs each, until the budget is spent. A model keeps its points (LlamaModel::
// measured_cost) by (KV dtype, batch, block size): a call measures only the shapes past those
// already measured, so an engine can measure its small shapes at startup and the larger ones later
// (spec/adaptive.h), and engines built one after another on the same model measure once. Returns
// every point measured so far, in order of work. The forwards write into a KV pool of their own (an
// engine's pool pre-touched this way made its later steps measurably slower). Errors: the pool
// cannot be allocated, a forward fails.
absl::StatusOr<std::vector<CostPoint>> MeasureForwardCost(LlamaModel& model, const CostGrid& grid);

}  // namespace specula
