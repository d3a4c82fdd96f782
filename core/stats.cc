#include "core/stats.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specula {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

Stats Summarize(std::vector<double> values) {
  Stats s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.median = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  return s;
}

absl::StatusOr<GoodputSlo> ParseGoodput(std::string_view spec) {
  GoodputSlo slo;
  int n = 0;
  // Debian's Abseil has its own string_view: split a std::string.
  const std::vector<std::string> items = absl::StrSplit(std::string(spec), absl::ByAnyChar(" \t,"), absl::SkipEmpty());
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    std::optional<double>* field = key == "ttft" ? &slo.ttft_ms : key == "tpot" ? &slo.tpot_ms
                                 : key == "e2el" ? &slo.e2el_ms : nullptr;
    if (colon == std::string_view::npos || field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "' is not KEY:MS with KEY ttft, tpot or e2el"));
    }
    double ms;
    if (!absl::SimpleAtod(item.substr(colon + 1), &ms) || !std::isfinite(ms) || ms <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "': the milliseconds must be a number > 0"));
    }
    if (field->has_value()) return absl::InvalidArgumentError(absl::StrCat("'", key, "' given twice"));
    *field = ms;
    ++n;
  }
  if (n == 0) return absl::InvalidArgumentError("no KEY:MS pairs (e.g. 'ttft:500 tpot:50')");
  return slo;
}

}  // namespace specula
