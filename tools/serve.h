// `specula serve`: gRPC and OpenAI-compatible HTTP serving of one model (serving/).
#pragma once

#include "absl/status/status.h"

namespace specula {

absl::Status RunServe(int argc, char** argv);

}  // namespace specula
