#include "experiments/calibrate_load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string_view>
#include <utility>
#include <random>
#include <thread>

#include "core/arrivals.h"
#include "core/clock.h"
#include "core/stats.h"
#include "core/status_macros.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "experiments/in_process_client.h"
#include "experiments/step_periods.h"
#include "serving/server.h"
#include "sim/step_time.h"

namespace specula::experiments {
namespace {

// The calibration's engine of `sc`, without speculation.
EngineVariant Unspeculative(const SchedulerConfig& sc) {
  EngineVariant v;
  v.scheduler = sc;
  v.spec = SpecConfig{};
  return v;
}

}  // namespace

absl::Status ProfileLoad(LoadedEngine& e, SchedulerConfig sc, const LoadProfile& p, nlohmann::json* steps) {
  constexpr int32_t kMinLen = 16, kMaxOutput = 96;
  sc.num_spec_tokens = 0;
  sc.max_num_seqs = std::max(sc.max_num_seqs, 2 * p.concurrency);
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, Unspeculative(sc)));
  Engine& engine = *made;
  StepPeriods periods(
      [&](const StepPeriods::Step& s, double seconds) { steps->push_back(StepPeriods::Json(s, seconds, "load")); });
  std::atomic<bool> profiling{false};
  engine.set_step_observer([&](const StepPlan& plan, const StepResult& result, double start_s) {
    if (profiling) periods.Add(plan, result, start_s, engine.HasUnfinished());
  });
  ServeOptions so;
  so.model_name = "calibrate";
  Server server(&engine, e.tokenizer.get(), e.model->config(), so);
  // A request takes about its mean output times a decode step, and its prompt's prefill, of the
  // loop's time: the rate that keeps `concurrency` of them in flight.
  const int32_t max_prompt = std::max(kMinLen, std::min(p.max_prompt_len, sc.max_model_len - kMaxOutput - 1));
  // Prompt lengths are log-uniform in [kMinLen, max_prompt]: served prompts are mostly short, and a
  // fit needs batches of many short sequences as much as long ones to tell attention's positions from
  // the per-sequence work.
  const double span = static_cast<double>(max_prompt) / kMinLen;
  const double mean_prompt = max_prompt > kMinLen ? (max_prompt - kMinLen) / std::log(span) : kMinLen;
  const double per_request = (kMinLen + kMaxOutput) / 2.0 * std::max(p.decode_step_s, 1e-6) +
                             p.concurrency * mean_prompt * p.prefill_token_s;
  ArrivalOptions a;
  a.request_rate = p.concurrency / per_request;
  a.num_requests = std::max(p.requests, std::min(2000, static_cast<int32_t>(a.request_rate * p.min_seconds)));
  a.seed = p.seed;
  std::mt19937 rng(p.seed);
  const int32_t vocab = e.model->config().vocab_size;
  std::vector<LoadRequest> requests(a.num_requests);
  for (LoadRequest& r : requests) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const int32_t len = std::min(max_prompt, static_cast<int32_t>(kMinLen * std::pow(span, u)));
    for (int32_t t = 0; t < len; ++t) r.prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
    r.max_tokens = std::uniform_int_distribution<int32_t>(kMinLen, kMaxOutput)(rng);
    r.ignore_eos = true;
  }
  {  // untimed: the engine's first steps touch its threads and KV memory
    const std::vector<LoadRequest> warm = {LoadRequest{"", std::vector<int32_t>(max_prompt, 3), 2, true}};
    InProcessClient client(&server, &warm, 0.0, p.seed);
    RunLoad(client, warm, {0.0}, RunOptions{});
    server.WaitIdle(std::chrono::milliseconds(60000));
  }
  // The experiments' in-process client and load generator: the same threads a measured run has.
  InProcessClient client(&server, &requests, 0.0, p.seed);
  profiling = true;
  RunLoad(client, requests, ArrivalTimes(a), RunOptions{});
  server.WaitIdle(std::chrono::milliseconds(60000));
  periods.Finish();
  return absl::OkStatus();
}

absl::StatusOr<double> MeasureRequestOverhead(LoadedEngine& e, SchedulerConfig sc, int32_t n) {
  sc.num_spec_tokens = 0;
  sc.enable_prefix_caching = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, Unspeculative(sc)));
  Engine& engine = *made;
  std::vector<double> step_s;  // [steps]: start to end, on the loop's thread (read once it is idle)
  engine.set_step_observer([&](const StepPlan&, const StepResult&, double start_s) {
    step_s.push_back(DefaultClock()->NowSeconds() - start_s);
  });
  ServeOptions so;
  so.model_name = "calibrate";
  Server server(&engine, e.tokenizer.get(), e.model->config(), so);
  // n + 1 one-token requests (the first untimed), one at a time, each to an idle loop: a step each.
  std::vector<double> ttft;  // [completed requests but the first]
  for (int32_t i = 0; i <= n; ++i) {
    const std::vector<LoadRequest> one = {LoadRequest{"", std::vector<int32_t>(16, 3 + i % 7), 1, true}};
    InProcessClient client(&server, &one, 0.0, i);
    RunOptions ro;
    ro.max_concurrency = 1;
    const RunResult run = RunLoad(client, one, {0.0}, ro);
    server.WaitIdle(std::chrono::milliseconds(60000));
    if (i > 0 && run.requests[0].outcome == Outcome::kOk) ttft.push_back(run.requests[0].ttft_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the loop asleep, as between arrivals
  }
  if (ttft.empty() || step_s.empty()) return absl::InternalError("request overhead: no request completed");
  // Medians, each robust to the odd request that shared a step or waited on a busy machine.
  return std::max(0.0, UpperMedian(ttft) - UpperMedian(step_s));
}

namespace {

// Each decode step of `batch` sequences during which a probe was sent against the last such step
// without one before it (its contexts one token shorter): the median of the differences, or 0 with
// fewer than `min_pairs`. `sent`: sorted, on the steps' clock.
double PairedArrivalSeconds(const std::vector<std::pair<StepPeriods::Step, double>>& steps,
                            const std::vector<double>& sent, int32_t batch, size_t min_pairs) {
  std::vector<double> diffs;  // [steps with a probe sent during them]
  double last_without = -1;
  for (const auto& [s, seconds] : steps) {
    if (std::string_view(s.kind) != "decode" || s.work.seqs != batch) continue;
    const auto from = std::lower_bound(sent.begin(), sent.end(), s.start_s);
    if (from == sent.end() || *from >= s.start_s + seconds) {
      last_without = seconds;
    } else if (last_without > 0) {
      diffs.push_back(seconds - last_without);
    }
  }
  if (diffs.size() < min_pairs) return 0.0;  // too few to tell
  return std::max(0.0, UpperMedian(std::move(diffs)));
}

}  // namespace

absl::StatusOr<double> MeasureArrivalCost(LoadedEngine& e, SchedulerConfig sc, double decode_step_s, bool text) {
  constexpr int32_t kBatch = 2, kProbes = 48, kPromptIds = 16, kLead = 20;
  constexpr double kSpacing = 8;  // decode steps between probes, on average
  sc.num_spec_tokens = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, Unspeculative(sc)));
  Engine& engine = *made;
  std::vector<std::pair<StepPeriods::Step, double>> steps;  // [steps]: each with its period
  StepPeriods periods([&](const StepPeriods::Step& s, double seconds) { steps.emplace_back(s, seconds); });
  engine.set_step_observer([&](const StepPlan& plan, const StepResult& result, double start_s) {
    periods.Add(plan, result, start_s, engine.HasUnfinished());
  });
  ServeOptions so;
  so.model_name = "calibrate";
  Server server(&engine, e.tokenizer.get(), e.model->config(), so);
  // kBatch long requests decode steadily while short prompts arrive between their steps.
  std::mt19937 rng(7);
  const int32_t vocab = e.model->config().vocab_size;
  auto ids = [&](int32_t n) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    return v;
  };
  const int32_t background = std::min(600, sc.max_model_len - kPromptIds - 1);
  std::vector<LoadRequest> requests;
  std::vector<double> arrivals;
  for (int32_t i = 0; i < kBatch; ++i) {
    requests.push_back(LoadRequest{"", ids(kPromptIds), background, true});
    arrivals.push_back(0.0);
  }
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  double t = kLead * decode_step_s;
  for (int32_t i = 0; i < kProbes; ++i, t += kSpacing * decode_step_s * jitter(rng)) {
    LoadRequest probe{"", ids(2 * kPromptIds), 1, true};
    if (text) probe.prompt = e.tokenizer->Decode(probe.prompt_token_ids);
    if (!probe.prompt.empty()) probe.prompt_token_ids.clear();
    requests.push_back(std::move(probe));
    arrivals.push_back(t);
  }
  InProcessClient client(&server, &requests, 0.0, 7);
  const RunResult run = RunLoad(client, requests, arrivals, RunOptions{});
  server.WaitIdle(std::chrono::milliseconds(60000));
  periods.Finish();
  std::vector<double> sent;  // [probes]: on the steps' clock
  for (size_t i = kBatch; i < run.requests.size(); ++i) sent.push_back(run.start_s + run.requests[i].send_s);
  std::sort(sent.begin(), sent.end());
  return PairedArrivalSeconds(steps, sent, kBatch, kProbes / 4);
}

}  // namespace specula::experiments
