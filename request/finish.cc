#include "request/finish.h"

#include <array>

namespace specula {
namespace {

// OpenAI has no name for a request that did not finish or failed: a stream that ends so reads
// "abort". gRPC leaves them unspecified.
constexpr std::array<FinishNames, 6> kFinishNames = {{
    {FinishReason::kNone, "none", "abort", "FINISH_REASON_UNSPECIFIED"},
    {FinishReason::kStopToken, "stop", "stop", "FINISH_REASON_STOP"},
    {FinishReason::kStopString, "stop_string", "stop", "FINISH_REASON_STOP"},
    {FinishReason::kMaxTokens, "length", "length", "FINISH_REASON_LENGTH"},
    {FinishReason::kAborted, "abort", "abort", "FINISH_REASON_ABORTED"},
    {FinishReason::kError, "error", "abort", "FINISH_REASON_UNSPECIFIED"},
}};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kFinishNames.size(); ++i) {
    if (static_cast<size_t>(kFinishNames[i].reason) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kFinishNames has one row per FinishReason, in the enum's order");

}  // namespace

const FinishNames& FinishNamesOf(FinishReason reason) {
  const size_t i = static_cast<size_t>(reason);
  return kFinishNames[i < kFinishNames.size() ? i : static_cast<size_t>(FinishReason::kNone)];
}

}  // namespace specula
