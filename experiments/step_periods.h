// Served steps timed as the serving loop spends them: a step's period runs from its start to the
// next step's start when the loop went straight on (so it holds the host work between steps:
// delivering the outputs, taking new requests), else, when the loop then idled, to its own end.
// Fed from the engine's step observer on the loop's thread.
#pragma once

#include <functional>
#include <optional>
#include <utility>

#include "core/clock.h"
#include "nlohmann/json.hpp"
#include "sim/step_time.h"

namespace specula::experiments {

class StepPeriods {
 public:
  struct Step {
    StepWork work;
    const char* kind = "decode";  // StepKind
    double start_s = 0, end_s = 0;
    bool busy_after = false;  // the engine had unfinished work when the step ended
    bool timed = true;        // emitted (false: the period is only a boundary)
  };
  using Emit = std::function<void(const Step&, double seconds)>;
  // A calibration's step: {seqs, tokens, rows, positions, seconds, kind, phase}.
  static nlohmann::json Json(const Step& s, double seconds, const char* phase) {
    return {{"seqs", s.work.seqs}, {"tokens", s.work.tokens}, {"rows", s.work.rows}, {"positions", s.work.positions},
            {"seconds", seconds},  {"kind", s.kind},         {"phase", phase}};
  }
  explicit StepPeriods(Emit emit) : emit_(std::move(emit)) {}

  // The step that just ran; emits the one before it, whose period is now known.
  void Add(const Step& s) {
    Flush(s.start_s);
    pending_ = s;
  }
  // The same from the engine's step observer (after the update), ending now.
  void Add(const StepPlan& plan, const StepResult& result, double start_s, bool busy_after, bool timed = true) {
    const StepWork w = RanWork(plan, result);
    Add({w, StepKind(plan, w), start_s, DefaultClock()->NowSeconds(), busy_after, timed});
  }
  // Emits the last step (the run is over: it ends at its own end).
  void Finish() { Flush(-1); }

 private:
  void Flush(double next_start_s) {
    if (!pending_ || !pending_->timed) {
      pending_.reset();
      return;
    }
    const Step& p = *pending_;
    const double end = p.busy_after && next_start_s >= p.end_s ? next_start_s : p.end_s;
    emit_(p, end - p.start_s);
    pending_.reset();
  }
  Emit emit_;
  std::optional<Step> pending_;
};

}  // namespace specula::experiments
