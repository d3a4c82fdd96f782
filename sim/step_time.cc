#include "sim/step_time.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specula {
namespace {

// The basis of the fit at one step's work: [1, tokens, max(0, tokens - knot) per inner knot, rows,
// positions, seqs].
std::vector<double> Basis(const std::vector<double>& knots, const StepWork& w) {
  std::vector<double> x = {1.0, w.tokens};
  for (size_t k = 1; k + 1 < knots.size(); ++k) x.push_back(std::max(0.0, w.tokens - knots[k]));
  x.push_back(w.rows);
  x.push_back(w.positions);
  x.push_back(w.seqs);
  return x;
}

// Solves (A^T A + ridge) x = A^T b by Gaussian elimination with partial pivoting; columns are
// scaled to unit maximum first so the ridge is the same small pull on each.
std::vector<double> LeastSquares(const std::vector<std::vector<double>>& a, const std::vector<double>& b) {
  const size_t n = a.empty() ? 0 : a.front().size();
  if (n == 0 || n > 4096) return {};
  std::vector<double> scale(n, 0.0);
  for (const auto& row : a) {
    for (size_t j = 0; j < n; ++j) scale[j] = std::max(scale[j], std::abs(row[j]));
  }
  for (double& s : scale) s = s > 0 ? s : 1.0;
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0.0));  // [n][n + 1]: normal equations
  double bmax = 0;
  for (double v : b) bmax = std::max(bmax, std::abs(v));
  for (size_t r = 0; r < a.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      const double xi = a[r][i] / scale[i];
      for (size_t j = 0; j < n; ++j) m[i][j] += xi * a[r][j] / scale[j];
      m[i][n] += xi * b[r] / bmax;
    }
  }
  for (size_t i = 0; i < n; ++i) m[i][i] += 1e-9 * a.size();
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[p][c])) p = r;
    }
    std::swap(m[c], m[p]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c || m[c][c] == 0) continue;
      const double f = m[r][c] / m[c][c];
      for (size_t j = c; j <= n; ++j) m[r][j] -= f * m[c][j];
    }
  }
  std::vector<double> x(n, 0.0);
  for (size_t i = 0; i < n; ++i) x[i] = m[i][i] != 0 ? m[i][n] / m[i][i] / scale[i] * bmax : 0.0;
  return x;
}

}  // namespace

StepWork PlanWork(const StepPlan& plan, const std::vector<int32_t>& drafts) {
  StepWork w;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const int32_t k = drafts.empty() ? s.num_spec : std::min(drafts[i], s.num_spec);
    const int32_t tokens = s.num_tokens - s.num_spec + k;
    w.seqs += 1;
    w.tokens += tokens;
    w.rows += s.num_spec > 0 ? 1 + k : 1;
    w.positions += AttendedPositions(s.start_pos, tokens);
  }
  return w;
}

StepWork RanWork(const StepPlan& plan, const StepResult& result) {
  std::vector<int32_t> drafts(plan.seqs.size(), 0);  // [plan]
  for (size_t i = 0, o = 0; i < plan.seqs.size(); ++i) {
    if (plan.seqs[i].samples && o < result.outputs.size()) drafts[i] = result.outputs[o++].num_drafts;
  }
  return PlanWork(plan, drafts);
}

const char* StepKind(const StepPlan& plan, const StepWork& w) {
  const bool chunk = std::any_of(plan.seqs.begin(), plan.seqs.end(), [](const ScheduledSeq& s) { return !s.samples; });
  return chunk || w.tokens > w.rows ? "prefill" : w.rows > w.seqs ? "verify" : "decode";
}

const char* CostOriginName(CostOrigin o) {
  switch (o) {
    case CostOrigin::kMeasured: return "measured";
    case CostOrigin::kCalibrated: return "calibrated";
    case CostOrigin::kRoofline: return "roofline";
  }
  return "?";
}

absl::StatusOr<StepTimeModel> StepTimeModel::Fit(const std::vector<StepSample>& samples, CostOrigin origin,
                                                 std::string description) {
  std::set<double> knots;
  for (size_t i = 0; i < samples.size(); ++i) {
    const StepSample& s = samples[i];
    const StepWork& w = s.work;
    for (double v : {w.seqs, w.tokens, w.rows, w.positions, s.seconds}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(absl::StrCat(description, ": step sample ", i, " has a value that is not finite and >= 0"));
      }
    }
    if (s.seconds <= 0 || w.tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat(description, ": step sample ", i, " needs seconds > 0 and tokens >= 1"));
    }
    knots.insert(w.tokens);
  }
  if (knots.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(description, ": steps of at least 2 distinct token counts are needed to fit a step-time model, got ",
                     knots.size()));
  }
  // Knots at powers of 2 across the measured range (not at every token count measured: a hinge at
  // each of a hundred counts overfits, with bumps of 100x between close counts).
  StepTimeModel m;
  for (double k = 1; k < *knots.rbegin(); k *= 2) {
    if (k >= *knots.begin()) m.knots_.push_back(k);
  }
  m.knots_.push_back(*knots.rbegin());
  if (m.knots_.size() < 2) m.knots_.insert(m.knots_.begin(), *knots.begin());
  m.origin_ = origin;
  m.description_ = std::move(description);
  std::vector<std::vector<double>> a;  // [samples][basis]
  std::vector<double> b;               // [samples]
  // Relative errors are what a prediction is judged by: each sample weighted by 1 / its time, so
  // that a 10 ms decode counts as much as a 1 s prefill.
  for (const StepSample& s : samples) {
    std::vector<double> x = Basis(m.knots_, s.work);
    for (double& v : x) v /= s.seconds;
    a.push_back(std::move(x));
    b.push_back(1.0);
  }
  m.coef_ = LeastSquares(a, b);
  return m;
}

double StepTimeModel::Seconds(const StepWork& w) const {
  if (roofline_.has_value()) {
    const Roofline& r = *roofline_;
    const double flops = ForwardFlops(r.shape, w.tokens, w.rows, w.positions);
    const double bytes = r.weight_bytes + r.kv_bytes_per_position * w.positions;
    return scale_ * (std::max(flops / r.flops_per_s, bytes / r.bytes_per_s) + r.fixed + r.per_row * w.rows);
  }
  if (coef_.empty()) return 0.0;
  const std::vector<double> x = Basis(knots_, w);
  double t = 0;
  for (size_t i = 0; i < x.size(); ++i) t += coef_[i] * x[i];
  return scale_ * std::max(t, 1e-6);
}

double StepTimeModel::Draw(const StepWork& w, std::mt19937_64& rng) const {
  const double t = Seconds(w);
  if (jitter_.empty()) return t;
  return t * jitter_[std::uniform_int_distribution<size_t>(0, jitter_.size() - 1)(rng)];
}

void StepTimeModel::SetJitter(std::vector<double> ratios) {
  jitter_.clear();
  ratios.erase(std::remove_if(ratios.begin(), ratios.end(), [](double r) { return !std::isfinite(r) || r <= 0; }),
               ratios.end());
  if (ratios.empty()) return;
  std::sort(ratios.begin(), ratios.end());
  for (size_t i = 0; i < kJitterQuantiles; ++i) {
    jitter_.push_back(ratios[(2 * i + 1) * ratios.size() / (2 * kJitterQuantiles)]);
  }
  // The spread only: the fit stays the mean (a calibration's steps run slower than served ones by
  // about their tail, docs/simulator.md).
  double mean = 0;
  for (double r : jitter_) mean += r / jitter_.size();
  for (double& r : jitter_) r /= mean;
}

absl::StatusOr<DeviceSpec> NamedDevice(const std::string& name) {
  // Datasheet peaks: dense BF16 tensor FLOPs and HBM bandwidth (SXM parts); the CPU's is this
  // VM's class (2 cores of AVX-512 at ~3 GHz: 2 FMA units x 16 floats x 2 FLOPs, ~20 GB/s).
  static const std::map<std::string, DeviceSpec> devices = {
      {"h100", {"h100", 989e12, 3.35e12, 80e9, 0.6, 0.8, 60e-6, 0}},
      {"h200", {"h200", 989e12, 4.8e12, 141e9, 0.6, 0.8, 60e-6, 0}},
      {"a100", {"a100", 312e12, 2.04e12, 80e9, 0.6, 0.8, 60e-6, 0}},
      {"cpu-avx512-2core", {"cpu-avx512-2core", 384e9, 20e9, 24e9, 0.5, 0.7, 200e-6, 20e-6}},
  };
  auto it = devices.find(name);
  if (it != devices.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& [k, v] : devices) known.push_back(k);
  return absl::InvalidArgumentError(absl::StrCat("unknown device '", name, "'; known: ", absl::StrJoin(known, ", ")));
}

absl::StatusOr<ForwardShape> NamedForwardShape(const std::string& name) {
  // dim, q_dim, kv_dim, hidden_dim, head_dim, heads, layers, vocab: from the models' config.json.
  static const std::map<std::string, ForwardShape> shapes = {
      {"llama-3.2-1b", {2048, 2048, 512, 8192, 64, 32, 16, 128256}},
      {"llama-3.1-8b", {4096, 4096, 1024, 14336, 128, 32, 32, 128256}},
      {"llama-3.1-70b", {8192, 8192, 1024, 28672, 128, 64, 80, 128256}},
      {"qwen2.5-7b", {3584, 3584, 512, 18944, 128, 28, 28, 152064}},
      {"smollm2-135m", {576, 576, 192, 1536, 64, 9, 30, 49152}},
  };
  auto it = shapes.find(name);
  if (it != shapes.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& [k, v] : shapes) known.push_back(k);
  return absl::InvalidArgumentError(absl::StrCat("unknown model shape '", name, "'; known: ", absl::StrJoin(known, ", ")));
}

double ShapeParameters(const ForwardShape& s) {
  const double per_layer = s.dim * (s.q_dim + 2 * s.kv_dim) + s.q_dim * s.dim + 3 * s.dim * s.hidden_dim;
  return s.num_layers * per_layer + s.dim * s.vocab_size;
}

StepTimeModel RooflineModel(const ForwardShape& shape, double bytes_per_weight, double kv_bytes_per_value,
                            const DeviceSpec& d) {
  StepTimeModel m;
  m.origin_ = CostOrigin::kRoofline;
  m.description_ = absl::StrCat("roofline of ", d.name, " (", d.peak_flops / 1e12, " TFLOP/s, ", d.bandwidth / 1e9,
                                " GB/s)");
  m.roofline_ = StepTimeModel::Roofline{shape,
                                        ShapeParameters(shape) * bytes_per_weight,
                                        2 * shape.kv_dim * shape.num_layers * kv_bytes_per_value,
                                        d.peak_flops * d.compute_efficiency,
                                        d.bandwidth * d.bandwidth_efficiency,
                                        d.step_overhead_s,
                                        d.per_row_s};
  return m;
}

}  // namespace specula
