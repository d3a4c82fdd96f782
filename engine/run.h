// The loop that every offline caller drives: `generate` (one prompt or a prompts file), the
// experiment runner, benchmarks and tests. Serving's EngineLoop runs the same steps and the same
// deltas on a thread of its own, adding and cancelling requests between them.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace specula {

struct RunCallbacks {
  std::function<void(const RequestDelta&)> on_delta;  // every delta, in order (a request's last: finished)
  std::function<void()> after_step;
  std::function<bool()> stop;  // checked before each step: true aborts every request and returns Cancelled
};

// Steps the engine until no request is left. Returns the finished outputs in the order they finished.
absl::StatusOr<std::vector<RequestOutput>> RunToCompletion(Engine& engine, const RunCallbacks& callbacks = {});

}  // namespace specula
