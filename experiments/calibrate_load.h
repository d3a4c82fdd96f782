// The served-traffic part of `specula experiment calibrate`: Poisson arrivals of random prompts
// through the serving core, each stream consumed by a thread of its own, at rates that keep about
// a given number of requests in flight. Every step is a sample: the mixed batches (decodes beside a
// prompt's chunk, sequences at different contexts) and the host work of arrivals and deliveries
// that a served step has and the grid's uniform shapes lack.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/engine_setup.h"
#include "nlohmann/json.hpp"
#include "scheduler/scheduler.h"

namespace specula::experiments {

struct LoadProfile {
  int32_t concurrency = 4;        // requests in flight, on average
  int32_t requests = 48;          // sent at this level at least,
  double min_seconds = 3.0;       // and as many more as its rate sends in this long (at most 2,000)
  int32_t max_prompt_len = 512;   // prompts log-uniform in [16, this]; outputs uniform in [16, 96]
  double decode_step_s = 0.01;    // a decode step at this concurrency (the grid's) and
  double prefill_token_s = 0;     // a prompt token's prefill: they set the rate
  uint32_t seed = 1;
};

// Appends {seqs, tokens, rows, positions, seconds, kind, "phase": "load"} per step (experiments/step_periods.h's
// period). Errors: the engine's refusal of its configuration.
absl::Status ProfileLoad(LoadedEngine& e, SchedulerConfig sc, const LoadProfile& p, nlohmann::json* steps);

// A request's time outside the steps, in seconds: over `n` one-token requests sent to an idle server
// (the experiments' in-process client), the median of the client's times to its token less the
// median step: the loop's wake, adding the request, delivering its delta to the client's thread.
absl::StatusOr<double> MeasureRequestOverhead(LoadedEngine& e, SchedulerConfig sc, int32_t n = 24);

// What a request's arrival adds to the step it lands in, in seconds: the client's thread submitting
// it takes a core from the forward (with `text`, tokenizing its prompt too, as an API server's
// requests are; else it sends token ids). Two long requests decode steadily while 48 short ones
// arrive between their steps (about every 8 steps of `decode_step_s`); the median, over the decode
// steps during which one was sent, of the step less the last such step without one. Steady steps
// keep the estimate free of the bias that a Poisson arrival lands in a longer step more often. 0
// when too few steps tell.
absl::StatusOr<double> MeasureArrivalCost(LoadedEngine& e, SchedulerConfig sc, double decode_step_s, bool text);

}  // namespace specula::experiments
