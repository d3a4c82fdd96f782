#include "experiments/parts.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specula::experiments {

absl::StatusOr<Part> ParsePart(const std::string& text) {
  const size_t slash = text.find('/');
  Part p;
  if (slash == std::string::npos || !absl::SimpleAtoi(text.substr(0, slash), &p.index) ||
      !absl::SimpleAtoi(text.substr(slash + 1), &p.count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--part: '", text, "' is not I/N (the part to run, 0-based, and how many parts), e.g. 0/3"));
  }
  if (p.count < 1) return absl::InvalidArgumentError(absl::StrCat("--part: ", text, ": N must be at least 1"));
  if (p.index < 0 || p.index >= p.count) {
    return absl::InvalidArgumentError(absl::StrCat("--part: ", text, ": I must be in [0, ", p.count - 1,
                                                   "] (parts are numbered from 0, as JOB_COMPLETION_INDEX)"));
  }
  return p;
}

std::string GroupKey(const Point& p) {
  Point base = p;
  base.spec_method = "none";
  base.num_spec_tokens.reset();
  return base.Key();
}

std::vector<Point> PointsOfPart(const std::vector<Point>& points, Part part) {
  std::map<std::string, int32_t> group_of;  // group key -> its number, in order of first appearance
  std::vector<Point> out;
  for (const Point& p : points) {
    const int32_t g = group_of.emplace(GroupKey(p), static_cast<int32_t>(group_of.size())).first->second;
    if (g % part.count == part.index) out.push_back(p);
  }
  return out;
}

}  // namespace specula::experiments
