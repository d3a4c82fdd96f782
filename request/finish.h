// The names of finish reasons, one table for every surface: the CLI's JSON lines and stderr
// (internal), OpenAI's finish_reason (HTTP), and the specula.v1.FinishReason value's name (gRPC,
// whose front end maps the name to the protobuf enum).
#pragma once

#include "core/step.h"

namespace specula {

struct FinishNames {
  FinishReason reason;
  const char* internal;  // `generate`'s finish_reason
  const char* openai;    // OpenAI's finish_reason
  const char* grpc;      // the specula.v1.FinishReason value
};

// The row of `reason`.
const FinishNames& FinishNamesOf(FinishReason reason);
inline const char* FinishName(FinishReason reason) { return FinishNamesOf(reason).internal; }
inline const char* OpenAiFinishName(FinishReason reason) { return FinishNamesOf(reason).openai; }
inline const char* GrpcFinishName(FinishReason reason) { return FinishNamesOf(reason).grpc; }

}  // namespace specula
