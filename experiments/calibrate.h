// `specula experiment calibrate`: a short measured profile of this machine for the serving
// simulator. Served steps are timed over a grid of batch sizes, contexts and tokens per sequence:
// prefill chunks, plain decode steps, and verification steps of k drafts each (drafts that are
// simply the last token, so that verification does its full work). Each runs behind the serving
// core with a consumer thread per stream, as a served request has, and a step's time is the period
// from one step's end to the next: the forward, the host work around it (scheduling, sampling or
// verification, outputs, the streams) and the threads that wake for each delta, which on a small
// machine take cores from the forward. With a draft model, its own steps are profiled the same way.
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
  int32_t decode_steps = 6;             // timed steps per shape (after one untimed)
  int64_t max_shape_tokens = 16384;     // a shape's batch x context at most
  std::function<void(int32_t done, int32_t total)> progress;
};

// The step-cost file's JSON for the loaded engine's target (and its draft model, if the engine's
// speculation method is "draft"). Errors: a shape the engine refuses (its error, naming the shape).
absl::StatusOr<nlohmann::json> Calibrate(LoadedEngine& e, const CalibrateOptions& options);

}  // namespace specula::experiments
