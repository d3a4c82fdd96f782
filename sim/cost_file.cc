#include "sim/cost_file.h"

#include <cmath>
#include <fstream>
#include <algorithm>
#include <map>
#include <tuple>

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
  if (j.contains("request_overhead_s")) {
    if (!j["request_overhead_s"].is_number() || j["request_overhead_s"].get<double>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"request_overhead_s\" is not a number >= 0"));
    }
    f.request_overhead_s = j["request_overhead_s"].get<double>();
  }
  f.description = f.target.model.description();
  return f;
}

absl::StatusOr<StepTimeModel> MeasuredDeviceModel(const std::string& device, const std::string& shape) {
  // (sequences, seconds of a decode step): docs/gpu.md. H100: BM_GpuDecodeStep with CUDA graphs,
  // context 512, 2026-11-23. H200: BM_GpuSpec without drafts, generated tokens/s of 32 + 128-token
  // requests (prefill amortized), 2026-11-26.
  static const std::map<std::string, std::vector<std::pair<double, double>>> decode = {
      {"h100", {{1, 1.72e-3}, {8, 2.56e-3}, {32, 5.26e-3}, {64, 9.20e-3}}},
      {"h200", {{1, 1.40e-3}, {32, 2.17e-3}, {64, 2.74e-3}}},
  };
  auto it = decode.find(device);
  if (it == decode.end() || shape != "llama-3.2-1b") {
    return absl::NotFoundError(absl::StrCat("no measured GPU table for device '", device, "' and shape '", shape,
                                            "' (measured: h100 and h200 with llama-3.2-1b); use the roofline"));
  }
  auto d = NamedDevice(device);
  auto s = NamedForwardShape(shape);
  if (!d.ok() || !s.ok()) return !d.ok() ? d.status() : s.status();
  const StepTimeModel roof = RooflineModel(*s, 2, 2, *d);
  std::vector<StepSample> samples;
  double ratio = 1;  // measured over roofline at the largest measured batch: the roofline's longer steps are scaled by it
  for (const auto& [seqs, seconds] : it->second) {
    const StepWork w{seqs, seqs, seqs, seqs * 513};
    samples.push_back({w, seconds});
    ratio = seconds / roof.Seconds(w);
  }
  for (double tokens = 256; tokens <= 16384; tokens *= 2) {
    for (double context : {0.0, 2048.0}) {
      const double seqs = std::min(tokens / 128, 64.0), per_seq = tokens / seqs;
      const StepWork w{seqs, tokens, seqs, seqs * AttendedPositions(context, per_seq)};
      samples.push_back({w, ratio * roof.Seconds(w)});
    }
  }
  return StepTimeModel::Fit(samples, CostOrigin::kMeasured,
                            absl::StrCat("measured ", device, " decode steps (docs/gpu.md, ", shape,
                                         ", bf16); steps past 64 tokens from its roofline scaled to them"));
}

}  // namespace specula
