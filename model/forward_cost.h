// How long one forward pass of a model takes, by shape: the measurements behind the engine's step
// cost model (adaptive speculation, engine/step_cost.h). A forward's cost is described by a few
// features that the engine can also compute for a step it has not run yet.
#pragma once

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace specula {

// Features of one or more forward passes, summed: [forwards, tokens, logits rows, attention], the
// last being the positions every new token attends to, summed, in units of 1024.
using CostFeatures = std::array<double, 4>;

struct CostSample {
  CostFeatures x{};
  double seconds = 0;
};

// Features of one forward over sequences bringing `tokens[i]` new tokens at positions
// [start[i], start[i] + tokens[i]), with `rows` logits rows in all.
CostFeatures ForwardFeatures(const std::vector<int32_t>& start, const std::vector<int32_t>& tokens, int32_t rows);

struct CostGrid {
  int32_t max_spec_tokens = 8;  // the verification shape measured: 1 + this many tokens
  int32_t batch = 8;            // sequences of the batched shapes
  int32_t block_size = 16;
  double budget_seconds = 1.0;  // stop measuring past this
};

// Runs a few forwards of `model` and returns their timings: one token, a verification run, a
// prefill chunk, and a decode batch at a short and a long context (256), the best of a few runs
// each, in that order of importance until the budget is spent. The forwards write into a KV pool
// of their own, sized for the grid (an engine's pool pre-touched this way made its later steps
// measurably slower). Errors: the pool cannot be allocated, a forward fails.
absl::StatusOr<std::vector<CostSample>> MeasureForwardCost(LlamaModel& model, const CostGrid& grid);

}  // namespace specula
