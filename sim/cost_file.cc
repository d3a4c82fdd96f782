#include "sim/cost_file.h"

#include <cmath>
#include <fstream>
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;
constexpr char kFormat[] = "specula.step_cost.v1";

const std::vector<std::pair<const char*, double ForwardShape::*>>& ShapeFields() {
  static const std::vector<std::pair<const char*, double ForwardShape::*>> f = {
      {"dim", &ForwardShape::dim},           {"q_dim", &ForwardShape::q_dim},
      {"kv_dim", &ForwardShape::kv_dim},     {"hidden_dim", &ForwardShape::hidden_dim},
      {"head_dim", &ForwardShape::head_dim}, {"num_heads", &ForwardShape::num_heads},
      {"num_layers", &ForwardShape::num_layers}, {"vocab_size", &ForwardShape::vocab_size}};
  return f;
}

absl::StatusOr<ForwardShape> ParseShape(const json& j, const std::string& where) {
  ForwardShape s;
  for (const auto& [name, field] : ShapeFields()) {
    if (!j.contains(name) || !j[name].is_number() || j[name].get<double>() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"shape\" needs a number > 0 in \"", name, "\""));
    }
    s.*field = j[name].get<double>();
  }
  return s;
}

// Repeated steps of one shape (sequences, tokens, rows, and positions within a factor of 2) as one
// sample: their median time at their mean positions. A served step's time has a long tail (the
// threads that wake for its deltas, the machine's other work): the fit is of the medians, and the
// tail is the model's jitter (StepTimeModel::SetJitter), drawn step by step.
std::vector<StepSample> Medians(const std::vector<StepSample>& samples) {
  std::map<std::tuple<double, double, double, double>, std::vector<StepSample>> by_shape;
  for (const StepSample& s : samples) {
    by_shape[{s.work.seqs, s.work.tokens, s.work.rows, std::floor(std::log2(s.work.positions + 1))}].push_back(s);
  }
  std::vector<StepSample> out;
  for (auto& [shape, v] : by_shape) {
    std::sort(v.begin(), v.end(), [](const StepSample& a, const StepSample& b) { return a.seconds < b.seconds; });
    StepSample m = v[v.size() / 2];
    m.work.positions = 0;
    for (const StepSample& s : v) m.work.positions += s.work.positions / v.size();
    out.push_back(m);
  }
  return out;
}

absl::StatusOr<std::vector<StepSample>> ParseSteps(const json& steps, const std::string& where) {
  std::vector<StepSample> out;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& p = steps[i];
    StepSample s;
    for (auto [name, v] : {std::pair<const char*, double*>{"seqs", &s.work.seqs}, {"tokens", &s.work.tokens},
                           {"rows", &s.work.rows}, {"positions", &s.work.positions}, {"seconds", &s.seconds}}) {
      if (!p.is_object() || !p.contains(name) || !p[name].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": steps[", i, "] needs a number in \"", name, "\""));
      }
      *v = p[name].get<double>();
    }
    out.push_back(s);
  }
  return out;
}

// A cache table ("kv=bf16 batch=8 block=16": forwards of n tokens over min(n, batch) sequences at
// positions 32, 33, ...; model/forward_cost.cc) as steps.
absl::StatusOr<std::vector<StepSample>> TableSteps(const json& tables, const std::string& where) {
  std::vector<StepSample> out;
  for (const auto& [name, points] : tables.items()) {
    int32_t batch = 8;
    for (absl::string_view part : absl::StrSplit(name, ' ')) {
      if (absl::ConsumePrefix(&part, "batch=") && !absl::SimpleAtoi(part, &batch)) batch = 8;
    }
    for (const json& p : points) {
      if (!p.is_object() || !p.contains("tokens") || !p.contains("seconds")) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": table \"", name, "\" has a point without tokens or seconds"));
      }
      const double n = p["tokens"].get<double>(), seqs = std::min<double>(n, batch), per_seq = std::ceil(n / seqs);
      out.push_back({{seqs, n, n, seqs * AttendedPositions(32, per_seq)}, p["seconds"].get<double>()});
    }
  }
  return out;
}

absl::StatusOr<ModelCost> ParseModel(const json& j, const std::string& where, std::optional<ForwardShape> fallback,
                                     CostOrigin origin) {
  ModelCost m;
  if (j.contains("shape")) {
    auto s = ParseShape(j["shape"], where);
    if (!s.ok()) return s.status();
    m.shape = *s;
  } else if (fallback.has_value()) {
    m.shape = *fallback;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no \"shape\" (a step-cost cache file: give the model's shape)"));
  }
  const bool steps = j.contains("steps") && j["steps"].is_array();
  absl::StatusOr<std::vector<StepSample>> samples =
      steps ? ParseSteps(j["steps"], where)
      : j.contains("tables") && j["tables"].is_object()
          ? TableSteps(j["tables"], where)
          : absl::StatusOr<std::vector<StepSample>>(
                absl::InvalidArgumentError(absl::StrCat(where, ": neither \"steps\" nor \"tables\" to fit step times to")));
  if (!samples.ok()) return samples.status();
  m.num_samples = static_cast<int32_t>(samples->size());
  if (j.contains("steps") && j.contains("tables") && j["tables"].is_object()) {
    for (const auto& [name, points] : j["tables"].items()) {  // the last table: one per file as written
      std::vector<CostPoint> f;
      for (const json& p : points) {
        f.push_back({p.value("flops", 0.0), p.value("seconds", 0.0), p.value("tokens", 0)});
      }
      if (!f.empty()) m.forwards = f;
    }
  }
  std::string model = j.contains("identity") && j["identity"].is_object() ? j["identity"].value("model", "") : "";
  auto fitted = StepTimeModel::Fit(steps ? Medians(*samples) : *samples, origin, absl::StrCat(where, model.empty() ? "" : " (", model, model.empty() ? "" : ")"));
  if (!fitted.ok()) return fitted.status();
  m.model = *std::move(fitted);
  if (steps) {  // every measured step over the fit of the medians: how steps of one shape vary
    std::vector<double> ratios;
    for (const StepSample& x : *samples) ratios.push_back(x.seconds / m.model.Seconds(x.work));
    m.model.SetJitter(std::move(ratios));
  }
  return m;
}

}  // namespace

std::string ShapeJson(const ForwardShape& s) {
  json j;
  for (const auto& [name, field] : ShapeFields()) j[name] = s.*field;
  return j.dump();
}

absl::StatusOr<StepCostFile> LoadStepCostFile(const std::string& path, std::optional<ForwardShape> shape_if_missing) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  if (j.value("format", "") != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"format\" is not \"", kFormat, "\""));
  }
  StepCostFile f;
  auto target = ParseModel(j, path, shape_if_missing, CostOrigin::kCalibrated);
  if (!target.ok()) return target.status();
  f.target = *std::move(target);
  if (j.contains("draft")) {
    auto draft = ParseModel(j["draft"], path + " draft", std::nullopt, CostOrigin::kCalibrated);
    if (!draft.ok()) return draft.status();
    f.draft = *std::move(draft);
  }
  if (j.contains("scheduler") && j["scheduler"].is_object()) {
    const json& s = j["scheduler"];
    SchedulerConfig c;
    c.max_num_seqs = s.value("max_num_seqs", c.max_num_seqs);
    c.max_num_batched_tokens = s.value("max_num_batched_tokens", c.max_num_batched_tokens);
    c.block_size = s.value("block_size", c.block_size);
    c.num_blocks = s.value("num_blocks", c.num_blocks);
    c.max_model_len = s.value("max_model_len", c.max_model_len);
    f.scheduler = c;
  }
  using Seconds = std::pair<const char*, double*>;  // outside the steps, and an arrival's in one
  for (auto [key, out] : {Seconds{"request_overhead_s", &f.request_overhead_s}, Seconds{"arrival_s", &f.arrival_s},
                          Seconds{"arrival_token_ids_s", &f.arrival_token_ids_s}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_number() || j[key].get<double>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" is not a number >= 0"));
    }
    *out = j[key].get<double>();
  }
  f.description = f.target.model.description();
  return f;
}

namespace {

// Whole served engine steps of the llama-3.2-1b shape in bf16 on an H200 (`specula experiment
// calibrate --device cuda`, scripts/gpu_check.sh calibrate; 2026-11-28, docs/gpu.md): the medians of
// three calibrations (which agree within 3% shape by shape) over every grid shape timed at least 3
// times in each: decodes and verifications of 1 to 32 sequences at contexts 32, 256 and 1024, and
// one prompt's prefill. {seqs, tokens, rows, positions, milliseconds}.
constexpr double kH200Steps[][5] = {
    {1, 1, 1, 66, 1.33}, {1, 1, 1, 290, 1.38}, {1, 1, 1, 1058, 1.50}, {2, 2, 2, 132, 1.52},
    {2, 2, 2, 580, 1.56}, {2, 2, 2, 2116, 1.79}, {4, 4, 4, 263, 1.69}, {4, 4, 4, 1159, 1.80},
    {4, 4, 4, 4233, 2.22}, {8, 8, 8, 525, 1.61}, {8, 8, 8, 2317, 1.81}, {8, 8, 8, 8473, 2.62},
    {16, 16, 16, 1049, 1.83}, {16, 16, 16, 4641, 2.49}, {16, 16, 16, 16889, 4.74}, {32, 32, 32, 2097, 2.26},
    {32, 32, 32, 9313, 3.22}, {1, 2, 2, 219, 1.51}, {1, 2, 2, 667, 1.56}, {1, 2, 2, 2311, 1.80},
    {1, 3, 3, 1200, 1.66}, {1, 3, 3, 3819, 2.03}, {1, 5, 5, 2560, 1.83}, {1, 5, 5, 4385, 2.06},
    {2, 4, 4, 440, 1.72}, {2, 4, 4, 1330, 1.81}, {2, 4, 4, 4608, 2.25}, {2, 6, 6, 2448, 1.84},
    {2, 6, 6, 7548, 2.48}, {2, 10, 10, 5140, 2.14}, {2, 10, 10, 8805, 2.53}, {4, 8, 8, 876, 1.63},
    {4, 8, 8, 2670, 1.86}, {4, 8, 8, 9186, 2.64}, {4, 12, 12, 4812, 2.13}, {4, 12, 12, 15081, 3.49},
    {4, 20, 20, 10260, 2.77}, {4, 20, 20, 17005, 3.59}, {8, 16, 16, 1754, 1.88}, {8, 16, 16, 5322, 2.51},
    {8, 16, 16, 18268, 4.85}, {8, 24, 24, 9750, 3.32}, {8, 24, 24, 29462, 6.82}, {8, 40, 40, 20495, 4.00},
    {8, 40, 40, 30605, 5.28}, {16, 32, 32, 3528, 2.18}, {16, 32, 32, 10692, 3.17}, {16, 32, 32, 35738, 6.68},
    {16, 48, 48, 18123, 4.86}, {16, 48, 48, 56478, 11.67}, {16, 80, 80, 41412, 6.55}, {16, 80, 80, 56260, 8.30},
    {32, 64, 64, 6993, 2.98}, {32, 64, 64, 14108, 3.91}, {32, 96, 96, 32904, 6.20}, {32, 160, 160, 76470, 10.86},
    {1, 32, 1, 528, 2.08}, {1, 256, 1, 32896, 5.82}, {1, 1024, 1, 524800, 56.21}};

// The H100's decode steps, kernels alone (BM_GpuDecodeStep with CUDA graphs, context 512,
// 2026-11-23; docs/gpu.md): {seqs, seconds}. Served steps on the H200 ran 1.0-1.5x its own such
// table (docs/simulator.md).
constexpr double kH100Decode[][2] = {{1, 1.72e-3}, {8, 2.56e-3}, {32, 5.26e-3}, {64, 9.20e-3}};

// Prefills of whole 1,024-token prompts, 2,048 to 16,384 tokens a step (past the table), priced by
// the roofline times `ratio`.
void RooflinePrefills(const StepTimeModel& roof, double ratio, std::vector<StepSample>* out) {
  for (double tokens = 2048; tokens <= 16384; tokens *= 2) {
    const double seqs = tokens / 1024;
    const StepWork w{seqs, tokens, seqs, seqs * AttendedPositions(0, 1024)};
    out->push_back({w, ratio * roof.Seconds(w)});
  }
}

}  // namespace

absl::StatusOr<StepTimeModel> MeasuredDeviceModel(const std::string& device, const std::string& shape) {
  if ((device != "h100" && device != "h200") || shape != "llama-3.2-1b") {
    return absl::NotFoundError(absl::StrCat("no measured GPU table for device '", device, "' and shape '", shape,
                                            "' (measured: h100 and h200 with llama-3.2-1b); use the roofline"));
  }
  auto d = NamedDevice(device);
  auto s = NamedForwardShape(shape);
  if (!d.ok() || !s.ok()) return !d.ok() ? d.status() : s.status();
  const StepTimeModel roof = RooflineModel(*s, 2, 2, *d);
  std::vector<StepSample> samples;
  if (device == "h200") {
    for (const auto& r : kH200Steps) samples.push_back({{r[0], r[1], r[2], r[3]}, r[4] * 1e-3});
  } else {
    for (const auto& [seqs, seconds] : kH100Decode) samples.push_back({{seqs, seqs, seqs, seqs * 513}, seconds});
  }
  // Measured over roofline at the table's last point (the H200's: a prefill of 1,024 tokens; the
  // H100's: its largest decode): the longer steps are the roofline scaled by it.
  const double ratio = samples.back().seconds / roof.Seconds(samples.back().work);
  std::string what;
  if (device == "h200") {
    RooflinePrefills(roof, ratio, &samples);
    what = "measured h200 served steps (docs/gpu.md, llama-3.2-1b, bf16); prefills past 1024 tokens from its roofline scaled to them";
  } else {
    for (double tokens = 256; tokens <= 16384; tokens *= 2) {
      for (double context : {0.0, 2048.0}) {
        const double seqs = std::min(tokens / 128, 64.0), per_seq = tokens / seqs;
        const StepWork w{seqs, tokens, seqs, seqs * AttendedPositions(context, per_seq)};
        samples.push_back({w, ratio * roof.Seconds(w)});
      }
    }
    what = "measured h100 decode steps (docs/gpu.md, llama-3.2-1b, bf16); steps past 64 tokens from its roofline scaled to them";
  }
  return StepTimeModel::Fit(samples, CostOrigin::kMeasured, what);
}

}  // namespace specula
