// `specula experiment run SPEC --out DIR`, `specula experiment report DIR` and `specula experiment
// calibrate` (experiments/).
#pragma once

#include "absl/status/status.h"

namespace specula {

// Interrupted runs (Ctrl-C) return CancelledError: main exits 130.
absl::Status RunExperimentCommand(int argc, char** argv);
// `specula experiment calibrate` (tools/experiment_calibrate.cc).
absl::Status RunCalibrate(int argc, char** argv);

}  // namespace specula
