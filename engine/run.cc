#include "engine/run.h"

namespace specula {

absl::StatusOr<std::vector<RequestOutput>> RunToCompletion(Engine& engine, const RunCallbacks& callbacks) {
  std::vector<RequestOutput> finished;
  while (engine.HasUnfinished()) {
    if (callbacks.stop && callbacks.stop()) return absl::CancelledError("interrupted");
    for (RequestDelta& d : engine.Step()) {
      if (callbacks.on_delta) callbacks.on_delta(d);
      if (d.finished) finished.push_back(std::move(d.final));
    }
    if (callbacks.after_step) callbacks.after_step();
  }
  return finished;
}

}  // namespace specula
