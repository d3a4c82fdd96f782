// `specula plan` (tools/plan.cc).
#pragma once

#include "absl/status/status.h"

namespace specula {

absl::Status RunPlan(int argc, char** argv);

}  // namespace specula
