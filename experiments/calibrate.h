// `specula experiment calibrate`: a short measured profile of this machine for the serving
// simulator. Served steps are timed over a grid of batch sizes, contexts and tokens per sequence:
// prefill chunks, plain decode steps, and verification steps of k drafts each (drafts that are
// simply the last token, so that verification does its full work). Each runs behind the serving
// core with a consumer thread per stream, as a served request has, and a step's time is its period
// from its start to the next step's start (experiments/step_periods.h): the forward, the host work
// around it (scheduling, sampling or verification, outputs, the streams) and the threads that wake
// for each delta, which on a small machine take cores from the forward. Then served traffic at a few
// levels of requests in flight (experiments/calibrate_load.h): the mixed batches serving has. With
// a draft model, its own steps are profiled on the grid too.
// The result is a step-cost file (sim/cost_file.h) that `specula simulate --cost` and `specula plan
// --cost` read, with the forward table adaptive speculation's cost cache holds.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine_setup.h"
#include "nlohmann/json.hpp"

namespace specula::experiments {

struct CalibrateOptions {
  std::vector<int32_t> batches = {1, 2, 4, 8, 16, 32};
  std::vector<int32_t> contexts = {32, 256, 1024};
  std::vector<int32_t> ks = {1, 2, 4};  // drafts per sequence of the verification steps
  // Timed steps per shape and k (after one untimed): at least decode_steps and min_phase_s (steps of
  // a small model take 0.1 ms: a few of them are noise), at most max_phase_steps.
  int32_t decode_steps = 6;
  double min_phase_s = 0.25;
  int32_t max_phase_steps = 64;
  int64_t max_shape_tokens = 16384;     // a shape's batch x context at most
  // Served traffic after the grid (experiments/calibrate_load.h): the requests in flight of each
  // level (empty: none), and the requests sent at each.
  std::vector<int32_t> load_concurrency = {2, 6, 12};
  int32_t load_requests = 48;  // at least; more where the level's rate sends them in under min_load_s
  double min_load_s = 3.0;
  std::function<void(int32_t done, int32_t total)> progress;
};

// The step-cost file's JSON for the loaded engine's target (and its draft model, if the engine's
// speculation method is "draft"). Errors: a shape the engine refuses (its error, naming the shape).
absl::StatusOr<nlohmann::json> Calibrate(LoadedEngine& e, const CalibrateOptions& options);

}  // namespace specula::experiments
