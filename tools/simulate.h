// `specula simulate` (tools/simulate.cc) and its --validate mode (tools/simulate_validate.cc).
#pragma once

#include "absl/status/status.h"
#include "core/flags.h"
#include "nlohmann/json.hpp"
#include "sim/fleet.h"

namespace specula {

absl::Status RunSimulate(int argc, char** argv);
// Replays an experiment's ONLINE results (flags: validate, cost, json, and the simulator's).
absl::Status RunValidate(const Flags& flags);
// What bench-serve's JSON has, and the flat keys of --validate's points (ttft_p50_ms, ...).
nlohmann::json SimSummaryJson(const SimSummary& s);

}  // namespace specula
