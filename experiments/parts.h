// A share of a sweep (`specula experiment run --part I/N`), so that one spec's points can run on
// several machines (an Indexed Job) and `experiment report DIR...` can merge the parts. Named "part"
// so that it cannot be taken for tensor-parallel sharding, which splits one model over ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "experiments/spec.h"

namespace specula::experiments {

struct Part {
  int32_t index = 0;  // I: 0-based, as Kubernetes' JOB_COMPLETION_INDEX
  int32_t count = 1;  // N; 1: the whole sweep
  bool whole() const { return count == 1; }
};

// "I/N" with integers 0 <= I < N; errors name --part and what is wrong.
absl::StatusOr<Part> ParsePart(const std::string& text);

// The key of a point's group: the points that differ only in speculation (spec_method and
// num_spec_tokens) share it, the `none` point among them being their speedups' baseline.
std::string GroupKey(const Point& p);

// The points of `part`, in the sweep's order: whole groups, group g (numbered in the order the
// groups first appear in the sweep) in part g mod N, so that a speedup and its baseline always run
// in the same part and the parts' sizes differ by at most one group. Deterministic: the same spec
// gives every machine the same split.
std::vector<Point> PointsOfPart(const std::vector<Point>& points, Part part);

}  // namespace specula::experiments
