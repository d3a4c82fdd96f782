// The simulator runs the engine's scheduling code: the engine (a tiny random target and draft
// model, --num-spec-tokens auto with fixed cost tables) and a simulated replica get the same
// arrivals and step times, the replica the engine's acceptances, and their schedules must agree
// step by step: the sequences, their tokens and positions, the chosen k, and the preemptions of a
// KV pool too small for the load.
#include <map>

#include "draft/draft_model_proposer.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/forward_cost.h"
#include "model/weights.h"
#include "sim/fleet.h"
#include "tests/tiny_pair.h"

namespace specula {
namespace {

// The engine's accepted drafts of the step it just ran, by request.
class ReplayAcceptance final : public AcceptanceModel {
 public:
  std::map<RequestId, int32_t> accepted;
  int32_t Accepted(RequestId id, int32_t k, int32_t, std::mt19937_64&) override {
    auto it = accepted.find(id);
    EXPECT_NE(it, accepted.end()) << "request " << id << " verified drafts in the simulator only";
    return it == accepted.end() ? 0 : std::min(it->second, k);
  }
  std::unique_ptr<AcceptanceModel> Fresh() const override { return std::make_unique<ReplayAcceptance>(); }
};

std::unique_ptr<LlamaModel> Load(const std::string& dir) {
  auto w = LoadModel(dir);
  EXPECT_TRUE(w.ok()) << w.status();
  return std::make_unique<LlamaModel>(std::move(w).value(), MakeCpuBackend({}));
}

std::vector<CostPoint> Table(const ModelConfig& c, double fixed, double per_token) {
  std::vector<CostPoint> t;
  for (int n = 1; n <= 512; n *= 2) t.push_back({ForwardFlops(c, n, n, n * 20.0), fixed + per_token * n, n});
  return t;
}

std::string Describe(const StepPlan& p) {
  std::string s;
  for (const ScheduledSeq& q : p.seqs) {
    s += std::to_string(q.id) + "@" + std::to_string(q.start_pos) + "+" + std::to_string(q.num_tokens) + "k" +
         std::to_string(q.num_spec) + (q.samples ? "s " : " ");
  }
  s += "| preempted";
  for (RequestId id : p.preempted) s += " " + std::to_string(id);
  return s;
}

// The replica of the engine below: its scheduler and fixed cost tables, a step-time model of 1 ms +
// 0.1 ms a token, and a draft at a fifth of that.
ReplicaConfig ReplicaLike(const SchedulerConfig& sc, const SpecConfig& spec, const LlamaModel& target,
                          const LlamaModel& draft) {
  ReplicaConfig rc;
  rc.scheduler = sc;
  rc.speculate = rc.adaptive = true;
  rc.target_shape = ShapeOf(target.config());
  rc.draft_shape = ShapeOf(draft.config());
  rc.target_cost = spec.target_cost;
  rc.draft_cost = spec.draft_cost;
  rc.refine_cost = false;
  std::vector<StepSample> samples;
  for (double t : {1.0, 8.0, 64.0}) samples.push_back({{1, t, 1, t}, 1e-3 + 1e-4 * t});
  rc.target = *StepTimeModel::Fit(samples, CostOrigin::kCalibrated, "test");
  rc.draft = rc.target;
  rc.draft.Scale(0.2);
  return rc;
}

// 24 requests at 400 req/s (several arrive during each step), 10-30 prompt and 20-60 output tokens.
std::vector<SimRequest> Arrivals() {
  SyntheticWorkload w;
  w.arrivals.num_requests = 24;
  w.arrivals.request_rate = 400;
  w.arrivals.seed = 5;
  w.prompt_len = 20;
  w.output_len = 40;
  w.len_spread = 0.5;
  return MakeRequests(w);
}

// The engine's request for a simulated one: random prompt ids of its length, its output length.
Request EngineRequest(const SimRequest& q, std::mt19937_64& rng) {
  Request r;
  r.id = q.id;
  for (int32_t i = 0; i < q.prompt_len; ++i) r.prompt.push_back(1 + static_cast<TokenId>(rng() % 11));
  r.max_tokens = q.output_len;
  r.ignore_eos = true;
  return r;
}

TEST(SameSchedule, EngineAndSimulatorAgreeStepByStep) {
  const auto [target_dir, draft_dir] = testing::WriteTinyPair();
  auto target = Load(target_dir), draft = Load(draft_dir);
  SchedulerConfig sc;
  sc.max_num_seqs = 6;
  sc.max_num_batched_tokens = 64;  // prompts arrive in chunks
  sc.block_size = 4;
  sc.num_blocks = 40;  // 160 positions for up to 6 sequences of ~60: preemptions
  sc.max_model_len = target->config().max_seq_len;
  sc.num_spec_tokens = 3;
  DraftModelProposer proposer(draft.get(), 4, 4096);
  SpecConfig spec;
  spec.proposer = &proposer;
  spec.adaptive = true;
  spec.target_cost = Table(target->config(), 1e-3, 1e-6);
  spec.draft_cost = Table(draft->config(), 2e-5, 5e-6);  // a catch-up of 20 tokens costs 5 drafts
  spec.refine_cost = false;
  ManualClock clock;
  Engine engine(target.get(), nullptr, sc, spec, &clock);
  ASSERT_TRUE(engine.Validate().ok());
  StepPlan engine_plan;
  StepResult engine_result;
  bool stepped = false;
  engine.set_step_observer([&](const StepPlan& p, const StepResult& r, double) {
    engine_plan = p;
    engine_result = r;
    stepped = true;
  });

  ReplayAcceptance acceptance;
  Replica replica(ReplicaLike(sc, spec, *target, *draft), &acceptance, 1);
  replica.set_record_steps(true);
  const std::vector<SimRequest> requests = Arrivals();
  std::mt19937_64 rng(9);
  size_t next = 0;
  double now = 0;
  int steps = 0, preemptions = 0, drafted = 0, plain = 0;
  while (next < requests.size() || engine.HasUnfinished()) {
    for (; next < requests.size() && requests[next].arrival_s <= now; ++next) {
      ASSERT_TRUE(engine.AddRequest(EngineRequest(requests[next], rng)).ok());
      ASSERT_EQ(replica.Submit(requests[next], now), "");
    }
    stepped = false;
    engine.Step();
    if (!stepped) {  // idle until the next arrival
      ASSERT_LT(next, requests.size());
      clock.Advance(requests[next].arrival_s - now);
      now = requests[next].arrival_s;
      ASSERT_FALSE(replica.Begin(now).has_value());
      continue;
    }
    acceptance.accepted.clear();
    for (const SeqOutput& o : engine_result.outputs) {
      if (o.num_drafts > 0) acceptance.accepted[o.id] = static_cast<int32_t>(o.new_tokens.size()) - 1;
    }
    const std::optional<double> d = replica.Begin(now);
    ASSERT_TRUE(d.has_value()) << "step " << steps;
    replica.End(now + *d);
    ASSERT_EQ(Describe(replica.steps().back().plan), Describe(engine_plan)) << "step " << steps;
    preemptions += static_cast<int>(engine_plan.preempted.size());
    for (const ScheduledSeq& s : engine_plan.seqs) {
      if (s.num_spec > 0) ++drafted;
      if (s.samples && s.num_spec == 0 && s.num_tokens == 1) ++plain;
    }
    clock.Advance(*d);
    now += *d;
    ++steps;
  }
  EXPECT_FALSE(replica.has_work());
  EXPECT_GT(steps, 50);
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small";
  EXPECT_GT(drafted, 0);
  EXPECT_GT(plain, 0) << "auto chose k = 0 on no sequence-step";
  std::printf("[same schedule] %d steps, %d preemptions, %d drafting and %d plain sequence-steps\n", steps,
              preemptions, drafted, plain);
}

}  // namespace
}  // namespace specula
