// `specula experiment run SPEC --out DIR` and `specula experiment report DIR` (experiments/).
#pragma once

#include "absl/status/status.h"

namespace specula {

// Interrupted runs (Ctrl-C) return CancelledError: main exits 130.
absl::Status RunExperimentCommand(int argc, char** argv);

}  // namespace specula
