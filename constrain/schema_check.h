// TEMPORARY until the checker lands.
#pragma once
#include "absl/status/status.h"
#include "constrain/limits.h"
#include "core/constraint_spec.h"
namespace specula {
inline absl::Status CheckConstraint(const ConstraintSpec& spec, const ConstraintLimits& limits) {
  return absl::OkStatus();
}
}  // namespace specula
