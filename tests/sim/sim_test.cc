// The serving simulator without a model: the step-time fit, the acceptance draws, queueing that
// follows the arithmetic, admission under overload, routing, and byte-for-byte determinism.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"
#include "sim/fleet.h"
#include "sim/cost_file.h"
#include "sim/planner.h"
#include "tests/test_util.h"

namespace specula {
namespace {

// A made-up machine: 2 ms a step, 0.05 ms a token past the first 8, 0.01 ms a row, 1 us per
// 100 positions, 0.02 ms a sequence.
double Truth(const StepWork& w) {
  return 2e-3 + 5e-5 * std::max(0.0, w.tokens - 8) + 1e-5 * w.rows + 1e-8 * w.positions + 2e-5 * w.seqs;
}

std::vector<StepSample> Grid() {
  std::vector<StepSample> s;
  for (double seqs : {1.0, 4.0, 16.0}) {
    for (double per_seq : {1.0, 4.0, 32.0}) {
      for (double context : {64.0, 1024.0}) {
        const StepWork w{seqs, seqs * per_seq, seqs, seqs * AttendedPositions(context, per_seq)};
        s.push_back({w, Truth(w)});
      }
    }
  }
  return s;
}

TEST(StepTimeModel, FitsAPiecewiseLinearMachine) {
  auto m = StepTimeModel::Fit(Grid(), CostOrigin::kCalibrated, "grid");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->origin(), CostOrigin::kCalibrated);
  for (const StepWork& w : {StepWork{2, 2, 2, 300}, StepWork{8, 64, 8, 9000}, StepWork{16, 512, 16, 40000}}) {
    EXPECT_NEAR(m->Seconds(w), Truth(w), 0.02 * Truth(w)) << w.tokens;
  }
}

TEST(StepTimeModel, RefusesTooFewOrBadSamples) {
  auto one = StepTimeModel::Fit({{{1, 1, 1, 10}, 1e-3}}, CostOrigin::kCalibrated, "one.json");
  EXPECT_NE(one.status().message().find("one.json: steps of at least 2 distinct token counts"), std::string::npos)
      << one.status();
  auto bad = StepTimeModel::Fit({{{1, 1, 1, 10}, -1}, {{1, 2, 1, 10}, 1e-3}}, CostOrigin::kCalibrated, "bad.json");
  EXPECT_NE(bad.status().message().find("bad.json: step sample 0"), std::string::npos) << bad.status();
}

TEST(StepTimeModel, JitterDrawsTheMeasuredVariationAroundTheFit) {
  auto m = StepTimeModel::Fit(Grid(), CostOrigin::kCalibrated, "grid");
  ASSERT_TRUE(m.ok()) << m.status();
  const StepWork w{4, 4, 4, 400};
  std::mt19937_64 rng(1);
  EXPECT_FALSE(m->has_jitter());
  EXPECT_EQ(m->Draw(w, rng), m->Seconds(w));  // without a measured variation: the fit
  // 4 steps in 5 at the fit, 1 in 5 at twice it: kept as spread around the fit, which stays the mean.
  std::vector<double> ratios;
  for (int i = 0; i < 1000; ++i) ratios.push_back(i % 5 == 0 ? 2.0 : 1.0);
  m->SetJitter(ratios);
  EXPECT_TRUE(m->has_jitter());
  double sum = 0;
  int slow = 0;
  const int n = 20000;
  std::mt19937_64 a(7), b(7);
  for (int i = 0; i < n; ++i) {
    const double t = m->Draw(w, a);
    EXPECT_EQ(t, m->Draw(w, b));  // the same stream, the same draws
    sum += t;
    slow += t > 1.5 * m->Seconds(w);  // 2 / 1.2 of the fit
  }
  EXPECT_NEAR(sum / n, m->Seconds(w), 0.02 * m->Seconds(w));
  EXPECT_NEAR(static_cast<double>(slow) / n, 0.2, 0.015);
  m->SetJitter({});
  EXPECT_FALSE(m->has_jitter());
}

TEST(StepTimeModel, RooflineIsBandwidthBoundAtOneTokenAndComputeBoundAtMany) {
  auto shape = NamedForwardShape("llama-3.1-8b");
  auto h100 = NamedDevice("h100");
  ASSERT_TRUE(shape.ok() && h100.ok());
  const StepTimeModel m = RooflineModel(*shape, 2, 2, *h100);
  EXPECT_EQ(m.origin(), CostOrigin::kRoofline);
  // One token: 16 GB of weights at 0.8 x 3.35 TB/s is ~6 ms.
  const double weights_s = ShapeParameters(*shape) * 2 / (3.35e12 * 0.8);
  EXPECT_NEAR(m.Seconds({1, 1, 1, 1}), weights_s, 0.15 * weights_s);
  // 8192 tokens: ~2 * 8e9 * 8192 FLOPs at 0.6 x 989 TFLOP/s, ~0.22 s; far past the bandwidth bound.
  const double flops_s = ForwardFlops(*shape, 8192, 32, 8192 * 256.0) / (989e12 * 0.6);
  EXPECT_NEAR(m.Seconds({32, 8192, 32, 8192 * 256.0}), flops_s, 0.15 * flops_s);
  EXPECT_FALSE(NamedDevice("tpu").ok());
  EXPECT_NE(NamedForwardShape("gpt-5").status().message().find("known: "), std::string::npos);
}

// The measured GPU tables: the H200's fit passes near its served steps (a decode, a verification
// and a prefill, sim/cost_file.cc's table) and grows past them; a shape without a table is refused.
TEST(StepTimeModel, MeasuredGpuTablesFollowTheirPoints) {
  auto h200 = MeasuredDeviceModel("h200", "llama-3.2-1b");
  ASSERT_TRUE(h200.ok()) << h200.status();
  EXPECT_EQ(h200->origin(), CostOrigin::kMeasured);
  EXPECT_NE(h200->description().find("h200 served steps"), std::string::npos);
  for (auto [w, ms] : {std::pair<StepWork, double>{{1, 1, 1, 290}, 1.38}, {{16, 16, 16, 16889}, 4.74},
                       {{32, 160, 160, 76470}, 10.86}, {{1, 256, 1, 32896}, 5.82}}) {
    EXPECT_NEAR(h200->Seconds(w) * 1e3, ms, 0.15 * ms) << w.seqs << " x " << w.tokens;
  }
  EXPECT_GT(h200->Seconds({8, 8192, 8, 8 * 524800.0}), 4 * h200->Seconds({1, 1024, 1, 524800}));
  auto h100 = MeasuredDeviceModel("h100", "llama-3.2-1b");
  ASSERT_TRUE(h100.ok()) << h100.status();
  EXPECT_NEAR(h100->Seconds({1, 1, 1, 513}) * 1e3, 1.72, 0.15 * 1.72);
  EXPECT_TRUE(absl::IsNotFound(MeasuredDeviceModel("h200", "llama-3.1-8b").status()));
  EXPECT_TRUE(absl::IsNotFound(MeasuredDeviceModel("a100", "llama-3.2-1b").status()));
}

TEST(Acceptance, FixedAlphaGivesTheGeometricMean) {
  auto a = PositionalAcceptance::Create({0.7});
  ASSERT_TRUE(a.ok());
  std::mt19937_64 rng(1);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sum += a->Accepted(i, 4, 1, rng);
  const double expected = 0.7 * (1 - std::pow(0.7, 4)) / (1 - 0.7);  // sum of 0.7^j, j = 1..4
  EXPECT_NEAR(sum / n, expected, 0.01);
  EXPECT_FALSE(PositionalAcceptance::Create({1.2}).ok());
  // Per position: 0.8 of first drafts, 0.4 of second ones, so the second's conditional is 0.5.
  auto p = PositionalAcceptance::FromPerPosition({0.8, 0.4});
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->conditional()[1], 0.5, 1e-12);
}

ReplicaConfig Cpu(int32_t max_seqs = 8) {
  ReplicaConfig c;
  c.scheduler.max_num_seqs = max_seqs;
  c.scheduler.num_blocks = 4096;
  c.target = *StepTimeModel::Fit(Grid(), CostOrigin::kCalibrated, "grid");
  c.target_shape = *NamedForwardShape("smollm2-135m");
  return c;
}

SyntheticWorkload Load(double rate, int32_t n, uint64_t seed = 7) {
  SyntheticWorkload w;
  w.arrivals.num_requests = n;
  w.arrivals.request_rate = rate;
  w.arrivals.seed = seed;
  w.prompt_len = 64;
  w.output_len = 32;
  return w;
}

TEST(Simulate, ALightLoadIsServedAtItsRateWithTheStepTimesOfOneSequence) {
  auto acc = PositionalAcceptance::Create({0.0});
  FleetConfig f;
  f.replica = Cpu();
  const FleetResult r = Simulate(f, MakeRequests(Load(0.5, 40)), &*acc, {});
  EXPECT_EQ(r.fleet.completed, 40);
  EXPECT_EQ(r.fleet.refused, 0);
  // Mostly alone: a decode step of one sequence at a short context.
  const double decode_ms = 1e3 * f.replica.target.Seconds({1, 1, 1, 80});
  EXPECT_NEAR(r.fleet.tpot_ms.median, decode_ms, 0.1 * decode_ms);
  // No backlog: the run ends within a second of the last arrival.
  EXPECT_GE(r.fleet.duration_s, r.replicas[0]->records().back().request.arrival_s);
  EXPECT_LT(r.fleet.duration_s, r.replicas[0]->records().back().request.arrival_s + 1.0);
  EXPECT_EQ(r.fleet.preemptions, 0);
}

// The request overhead delays what the client sees (every token of every request), not the
// schedule; the step jitter spreads the steps around the fit and keeps their mean.
TEST(Simulate, RequestOverheadAndStepJitter) {
  auto acc = PositionalAcceptance::Create({0.0});
  FleetConfig f;
  f.replica = Cpu();
  const auto requests = MakeRequests(Load(20, 200));
  const FleetResult plain = Simulate(f, requests, &*acc, {});
  f.replica.request_overhead_s = 0.005;
  const FleetResult late = Simulate(f, requests, &*acc, {});
  EXPECT_EQ(late.fleet.steps, plain.fleet.steps);
  const auto& a = plain.replicas[0]->records();
  const auto& b = late.replicas[0]->records();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i].first_token_s - a[i].first_token_s, 0.005, 1e-12);
    EXPECT_NEAR(b[i].finish_s - a[i].finish_s, 0.005, 1e-12);
  }
  EXPECT_NEAR(late.fleet.tpot_ms.median, plain.fleet.tpot_ms.median, 1e-9);

  f.replica.request_overhead_s = 0;
  std::vector<double> ratios;  // a step in 10 at 3x the others
  for (int i = 0; i < 100; ++i) ratios.push_back(i % 10 == 0 ? 3.0 : 1.0);
  f.replica.target.SetJitter(ratios);
  f.record_steps = true;
  const FleetResult jittered = Simulate(f, requests, &*acc, {});
  double sum = 0;
  int slow = 0;
  const std::vector<SimStep>& steps = jittered.replicas[0]->steps();
  for (const SimStep& st : steps) {
    const StepWork w = RanWork(st.plan, st.result);
    const double ratio = st.seconds / f.replica.target.Seconds(w);  // 3 / 1.2 or 1 / 1.2
    sum += ratio;
    slow += ratio > 2;
  }
  ASSERT_GT(steps.size(), 1000u);
  EXPECT_NEAR(sum / steps.size(), 1.0, 0.05);
  EXPECT_NEAR(static_cast<double>(slow) / steps.size(), 0.1, 0.03);
}

// A request that arrives while a step runs delays that step's end by arrival_s (the client's thread
// took a core from the forward); one that arrives to an idle replica delays nothing.
TEST(Simulate, AnArrivalDuringAStepDelaysThatStep) {
  auto acc = PositionalAcceptance::Create({0.0});
  FleetConfig f;
  f.replica = Cpu();
  f.record_steps = true;
  std::vector<SimRequest> requests = MakeRequests(Load(1, 2));
  requests[0].arrival_s = 0;
  const double prefill_s = f.replica.target.Seconds({1, 64, 1, 64 * 65 / 2.0});
  requests[1].arrival_s = prefill_s / 2;  // during the first request's prefill
  const FleetResult plain = Simulate(f, requests, &*acc, {});
  f.replica.arrival_s = 0.002;
  const FleetResult slowed = Simulate(f, requests, &*acc, {});
  const auto& a = plain.replicas[0]->records();
  const auto& b = slowed.replicas[0]->records();
  EXPECT_NEAR(a[0].first_token_s, prefill_s, 1e-9);  // the arrival to an idle replica: no delay
  EXPECT_NEAR(b[0].first_token_s - a[0].first_token_s, 0.002, 1e-9);
  EXPECT_NEAR(slowed.replicas[0]->steps()[0].seconds, prefill_s + 0.002, 1e-9);
  EXPECT_EQ(slowed.fleet.steps, plain.fleet.steps);  // the same schedule, later
  f.replica.arrival_token_ids_s = 0.0005;  // a request sent as token ids costs its own
  requests[1].text_prompt = false;
  const FleetResult ids = Simulate(f, requests, &*acc, {});
  EXPECT_NEAR(ids.replicas[0]->records()[0].first_token_s - a[0].first_token_s, 0.0005, 1e-9);
  // Under load every step with arrivals in it runs longer: TTFT and TPOT rise.
  const auto busy = MakeRequests(Load(60, 300));
  f.replica.arrival_s = 0;
  const SimSummary calm = Simulate(f, busy, &*acc, {}).fleet;
  f.replica.arrival_s = 0.001;
  const SimSummary stolen = Simulate(f, busy, &*acc, {}).fleet;
  EXPECT_GT(stolen.ttft_ms.median, calm.ttft_ms.median + 0.5);
  EXPECT_GT(stolen.tpot_ms.mean, calm.tpot_ms.mean);
  // While the replica waits out a batching window no forward runs: an arrival then delays nothing.
  f.replica.scheduler.max_wait_ms = 4;
  f.replica.scheduler.max_num_seqs = 4;
  requests[1].arrival_s = 0.001;
  requests[1].text_prompt = true;
  for (double cost : {0.0, 0.002}) {
    f.replica.arrival_s = cost;
    const FleetResult w = Simulate(f, requests, &*acc, {});
    ASSERT_FALSE(w.replicas[0]->steps().empty());
    EXPECT_NEAR(w.replicas[0]->steps()[0].start_s, 0.004, 1e-9) << cost;  // the window's end, whatever the arrival cost
  }
}

TEST(Simulate, OverloadWithAdmissionRefusesAndKeepsTtftBounded) {
  auto acc = PositionalAcceptance::Create({0.0});
  FleetConfig f;
  f.replica = Cpu(4);
  const SimSummary open = Simulate(f, MakeRequests(Load(200, 400)), &*acc, {}).fleet;
  f.replica.admission.max_queue_len = 8;
  const SimSummary guarded = Simulate(f, MakeRequests(Load(200, 400)), &*acc, {}).fleet;
  EXPECT_EQ(open.refused, 0);
  EXPECT_GT(guarded.refused, 100);
  EXPECT_EQ(guarded.refusals.at("queue_len"), guarded.refused);
  EXPECT_LT(guarded.ttft_ms.p99, 0.2 * open.ttft_ms.p99);
}

TEST(Simulate, RoutingSpreadsLoadAndSessionsStick) {
  auto acc = PositionalAcceptance::Create({0.0});
  FleetConfig f;
  f.replica = Cpu();
  f.replicas = 4;
  SyntheticWorkload w = Load(20, 400);
  w.num_sessions = 3;  // sessions 0, 1, 2 on replicas 0, 1, 2: replica 3 gets nothing
  w.prefix_reuse = 0.5;
  f.routing = Routing::kSessionAffinity;
  const FleetResult sticky = Simulate(f, MakeRequests(w), &*acc, {});
  EXPECT_EQ(sticky.per_replica[3].requests, 0);
  EXPECT_GT(sticky.per_replica[0].requests, 100);
  // The session's half prompt comes from the prefix cache.
  EXPECT_GT(sticky.replicas[0]->scheduler().blocks().hit_tokens(), 100 * 16);
  f.routing = Routing::kRoundRobin;
  const FleetResult even = Simulate(f, MakeRequests(w), &*acc, {});
  for (const SimSummary& s : even.per_replica) EXPECT_EQ(s.requests, 100);
}

std::string Dump(const FleetResult& r) {
  std::string out;
  char buf[128];
  for (const auto& rep : r.replicas) {
    for (const SimRequestRecord& rec : rep->records()) {
      std::snprintf(buf, sizeof buf, "%lld %a %a %d|", static_cast<long long>(rec.request.id), rec.first_token_s,
                    rec.finish_s, rec.output_tokens);
      out += buf;
    }
  }
  return out;
}

TEST(Simulate, TheSameSeedGivesTheSameRecordsByteForByte) {
  auto acc = PositionalAcceptance::Create({0.8, 0.6}, 20);
  FleetConfig f;
  f.replica = Cpu(16);
  f.replica.speculate = true;
  f.replica.adaptive = true;
  f.replica.scheduler.num_spec_tokens = 4;
  f.replicas = 2;
  f.seed = 3;
  const auto requests = MakeRequests(Load(30, 300));
  const std::string a = Dump(Simulate(f, requests, &*acc, {}));
  const std::string b = Dump(Simulate(f, requests, &*acc, {}));
  EXPECT_EQ(a, b);
  f.seed = 4;
  EXPECT_NE(a, Dump(Simulate(f, requests, &*acc, {})));
}

TEST(Simulate, GoodputCountsRequestsWithinEverySlo) {
  auto acc = PositionalAcceptance::Create({0.0});
  FleetConfig f;
  f.replica = Cpu(4);
  const auto requests = MakeRequests(Load(40, 200));
  const FleetResult r = Simulate(f, requests, &*acc, {});
  GoodputSlo slo;
  slo.ttft_ms = r.fleet.ttft_ms.median;  // about half meet it
  const FleetResult g = Simulate(f, requests, &*acc, slo);
  EXPECT_NEAR(g.fleet.goodput, 0.5, 0.05);
  EXPECT_NEAR(g.fleet.request_goodput, g.fleet.goodput * g.fleet.requests / g.fleet.duration_s, 1e-9);
}

TEST(LoadTrace, ReadsAnExperimentTraceAndNamesBadLines) {
  const std::string dir = testing::MakeTempDir();
  {
    std::ofstream(dir + "/t.jsonl") << R"({"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 4, "ttft_ms": 3})"
                                    << "\n" << R"({"arrival_s": 0.1, "prompt_tokens": 7, "output_tokens": 2, "prompt_text": false})" << "\n";
    std::ofstream(dir + "/bad.jsonl") << R"({"arrival_s": 0.5, "prompt_tokens": "ten", "output_tokens": 4})" << "\n";
  }
  auto t = LoadTrace(dir + "/t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].prompt_len, 7);  // sorted by arrival
  EXPECT_FALSE((*t)[0].text_prompt);
  EXPECT_TRUE((*t)[1].text_prompt);  // text unless the trace says token ids
  auto bad = LoadTrace(dir + "/bad.jsonl");
  EXPECT_NE(bad.status().message().find("bad.jsonl:1: field 'prompt_tokens'"), std::string::npos) << bad.status();
}

TEST(LoadTrace, ReadsDraftProfilesAndNamesBadOnes) {
  const std::string dir = testing::MakeTempDir();
  const std::string head = R"({"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 4)";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"(, "drafts_found": [1, 2, 0]})", "'drafts_found' and 'drafts_matched' come together"},
      {R"(, "drafts_found": [1, 2], "drafts_matched": [0, 0]})", "'drafts_found' must be an array of output_tokens - 1 (3)"},
      {R"(, "drafts_found": [1, 2, -1], "drafts_matched": [0, 0, 0]})", "'drafts_found' must hold integers"},
      {R"(, "drafts_found": [1, 2, 0], "drafts_matched": [0, 3, 0]})", "'drafts_matched' exceeds 'drafts_found' at 1"}};
  for (const auto& [tail, message] : bad) {
    std::ofstream(dir + "/bad.jsonl") << head << tail << "\n";
    auto t = LoadTrace(dir + "/bad.jsonl");
    EXPECT_NE(t.status().message().find(message), std::string::npos) << tail << ": " << t.status();
  }
  std::ofstream(dir + "/t.jsonl") << head << R"(, "drafts_found": [3, 0, 2], "drafts_matched": [1, 0, 2]})" << "\n"
                                  << head << "}\n";
  auto t = LoadTrace(dir + "/t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0].drafts.found, (std::vector<int32_t>{3, 0, 2}));
  EXPECT_EQ((*t)[0].drafts.matched, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_TRUE((*t)[1].drafts.found.empty());
}

// A request the server refused arrives all the same; a simulated replica may admit it, so it replays
// with the lengths of a completed request of its prompt, else the completed ones' medians.
TEST(LoadTrace, RefusedRequestsTakeTheLengthsOfTheirPromptOrTheMedians) {
  const std::string dir = testing::MakeTempDir();
  const std::string refused = R"(, "prompt_tokens": 0, "output_tokens": 0, "ok": false, "error": "overloaded"})";
  std::ofstream(dir + "/t.jsonl") << R"({"arrival_s": 0.0, "prompt_id": 0, "prompt_tokens": 30, "output_tokens": 7, "ok": true})" << "\n"
                                  << R"({"arrival_s": 0.1, "prompt_id": 1, "prompt_tokens": 10, "output_tokens": 3})" << "\n"
                                  << R"({"arrival_s": 0.2, "prompt_id": 2, "prompt_tokens": 20, "output_tokens": 5})" << "\n"
                                  << R"({"arrival_s": 0.3, "prompt_id": 0)" << refused << "\n"
                                  << R"({"arrival_s": 0.4, "prompt_id": 9)" << refused << "\n"
                                  << R"({"arrival_s": 0.5, "prompt_id": 1, "prompt_tokens": 10, "output_tokens": 2, "ok": false})" << "\n"
                                  << R"({"arrival_s": 0.6, "prompt_id": 1, "prompt_tokens": 12, "output_tokens": 0, "ok": false})" << "\n";
  std::string note;
  auto t = LoadTrace(dir + "/t.jsonl", &note);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 7u);
  EXPECT_EQ((*t)[3].prompt_len, 30);  // prompt 0's
  EXPECT_EQ((*t)[3].output_len, 7);
  EXPECT_EQ((*t)[4].prompt_len, 20);  // no completed request of prompt 9: the medians of 30, 10, 20 and 7, 3, 5
  EXPECT_EQ((*t)[4].output_len, 5);
  EXPECT_EQ((*t)[5].output_len, 2);  // failed after 2 tokens: what it ran is known
  EXPECT_EQ((*t)[6].prompt_len, 12);  // failed before a token: its prompt is known, its output is prompt 1's
  EXPECT_EQ((*t)[6].output_len, 3);
  EXPECT_NE(note.find("3 requests the server refused or that failed before a token"), std::string::npos) << note;
  EXPECT_NE(note.find("same prompt (2)"), std::string::npos) << note;

  std::ofstream(dir + "/none.jsonl") << R"({"arrival_s": 0.3)" << refused << "\n";
  auto none = LoadTrace(dir + "/none.jsonl");
  EXPECT_NE(none.status().message().find("no request completed (\"ok\": true) to give the lengths of the 1"), std::string::npos) << none.status();
  std::ofstream(dir + "/bad.jsonl") << R"({"arrival_s": 0.3, "prompt_tokens": 1, "output_tokens": 1, "ok": 0})" << "\n";
  auto bad = LoadTrace(dir + "/bad.jsonl");
  EXPECT_NE(bad.status().message().find("bad.jsonl:1: field 'ok' must be true or false"), std::string::npos) << bad.status();
}

// A request's profile decides its drafts and acceptance at each step; others draw from the fallback.
TEST(Acceptance, ProfilesReplayEachStepAndOthersUseTheFallback) {
  std::vector<SimRequest> requests(2);
  requests[0].id = 7;
  requests[0].drafts = {{3, 0, 5}, {1, 0, 4}};  // after 1, 2 and 3 output tokens
  requests[1].id = 9;
  auto a = WithDraftProfiles(requests, std::make_unique<PositionalAcceptance>(*PositionalAcceptance::Create({1.0})));
  std::mt19937_64 rng(1);
  EXPECT_EQ(a->Proposed(7, 4, 1, rng), 3);  // found 3 of the 4 asked for
  EXPECT_EQ(a->Accepted(7, 3, 1, rng), 1);
  EXPECT_EQ(a->Proposed(7, 4, 2, rng), 0);
  EXPECT_EQ(a->Proposed(7, 2, 3, rng), 2);  // asked for fewer than found: a prefix, matched up to k
  EXPECT_EQ(a->Accepted(7, 2, 3, rng), 2);
  EXPECT_EQ(a->Accepted(7, 5, 3, rng), 4);
  EXPECT_EQ(a->Accepted(9, 4, 1, rng), 4);  // no profile: the fallback accepts every draft
  EXPECT_EQ(a->Accepted(7, 4, 4, rng), 4);  // past the profile too
  // Without any profile the fallback itself comes back.
  auto plain = WithDraftProfiles({requests[1]}, std::make_unique<PositionalAcceptance>(*PositionalAcceptance::Create({1.0})));
  EXPECT_NE(dynamic_cast<PositionalAcceptance*>(plain.get()), nullptr);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// A plan over a roofline CPU replica and an H100 one: the CPU cannot prefill 512 tokens within the
// TTFT bound at any rate, the H100's capacity sets its replicas, and its fleet meets the SLOs at
// its share of the load.
TEST(Plan, FindsTheCapacityAndTheCheapestFleet) {
  PlanCandidate cpu;
  cpu.name = "cpu";
  cpu.replica.scheduler.max_num_seqs = 32;
  cpu.replica.scheduler.num_blocks = 50000;
  cpu.replica.target_shape = *NamedForwardShape("smollm2-135m");
  cpu.replica.target = RooflineModel(cpu.replica.target_shape, 0.6, 2, *NamedDevice("cpu-avx512-2core"));
  cpu.acceptance = std::make_shared<PositionalAcceptance>(*PositionalAcceptance::Create({0.0}));
  cpu.price_per_hour = 0.1;
  PlanWorkload w;
  w.requests.prompt_len = 512;
  w.requests.output_len = 256;
  w.requests.arrivals.burst_factor = 5;
  w.requests.arrivals.burst_start_s = 30;
  w.requests.arrivals.burst_duration_s = 5;
  w.duration_s = 10;
  PlanSlo slo;
  slo.ttft_p99_ms = 500;
  slo.per_request.ttft_ms = 500;
  PlanCandidate gpu = cpu;
  gpu.name = "h100";
  gpu.replica.scheduler.max_num_seqs = 128;
  gpu.replica.target_shape = *NamedForwardShape("llama-3.1-8b");
  gpu.replica.target = RooflineModel(gpu.replica.target_shape, 2, 2, *NamedDevice("h100"));
  gpu.price_per_hour = 4;
  const Plan plan = MakePlan({cpu, gpu}, w, slo, {2000});
  ASSERT_EQ(plan.candidates.size(), 2u);
  EXPECT_EQ(plan.candidates[0].capacity, 0);
  EXPECT_EQ(plan.candidates[0].at[0].replicas, 0);
  const CandidatePlan& c = plan.candidates[1];
  EXPECT_GT(c.capacity, 1);
  EXPECT_EQ(c.at[0].replicas, static_cast<int64_t>(std::ceil(2000 / c.capacity - 1e-9)));
  EXPECT_TRUE(MeetsSlo(c.at[0].at_share, slo));
  EXPECT_GE(c.at[0].headroom, 0);
  EXPECT_EQ(plan.cheapest[0], 1);
  // Above the capacity the SLOs fail; at it they hold (the search's bracket).
  bool above_fails = false;
  for (const LoadPoint& p : c.curve) above_fails = above_fails || (p.rate > c.capacity && !p.meets);
  EXPECT_TRUE(above_fails);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// A calibration file (as `experiment calibrate` writes it) and a cache file read back; bad ones
// are refused naming the file and the field.
TEST(StepCostFile, ReadsCalibrationsAndCacheFilesAndNamesWhatIsWrong) {
  const std::string dir = testing::MakeTempDir();
  const std::string shape = ShapeJson(*NamedForwardShape("smollm2-135m"));
  // Each shape 5 times: 4 at the machine's time and 1 at 3x it (a step the host's other threads
  // held up), which the fit of medians leaves out and the jitter keeps.
  std::string steps = "[";
  for (const StepSample& s : Grid()) {
    for (int i = 0; i < 5; ++i) {
      steps += (steps.size() > 1 ? "," : "") + std::string("{\"seqs\":") + std::to_string(s.work.seqs) +
               ",\"tokens\":" + std::to_string(s.work.tokens) + ",\"rows\":" + std::to_string(s.work.rows) +
               ",\"positions\":" + std::to_string(s.work.positions) +
               ",\"seconds\":" + std::to_string((i == 4 ? 3 : 1) * s.seconds) + "}";
    }
  }
  steps += "]";
  const std::string table = R"({"kv=bf16 batch=8 block=16": [{"tokens": 1, "flops": 1e8, "seconds": 0.002},
                                                          {"tokens": 2, "flops": 2e8, "seconds": 0.0021}]})";
  {
    std::ofstream(dir + "/cal.json") << R"({"format": "specula.step_cost.v1", "shape": )" << shape << R"(, "steps": )"
                                     << steps << R"(, "tables": )" << table
                                     << R"(, "scheduler": {"num_blocks": 777, "max_model_len": 2048},
                                        "draft": {"shape": )" << shape << R"(, "steps": )" << steps << "}}";
    std::ofstream(dir + "/cache.json") << R"({"format": "specula.step_cost.v1", "tables": )" << table << "}";
    std::ofstream(dir + "/old.json") << R"({"format": "specula.step_cost.v0", "tables": {}})";
    std::ofstream(dir + "/late.json") << R"({"format": "specula.step_cost.v1", "shape": )" << shape
                                      << R"(, "steps": )" << steps << R"(, "request_overhead_s": 0.0003, "arrival_s": 0.0002,
                                          "arrival_token_ids_s": 0.0001})";
    std::ofstream(dir + "/bad.json") << R"({"format": "specula.step_cost.v1", "shape": )" << shape
                                     << R"(, "steps": )" << steps << R"(, "request_overhead_s": -1})";
  }
  auto cal = LoadStepCostFile(dir + "/cal.json");
  ASSERT_TRUE(cal.ok()) << cal.status();
  EXPECT_EQ(cal->target.model.origin(), CostOrigin::kCalibrated);
  const StepWork w{8, 64, 8, 9000};
  EXPECT_NEAR(cal->target.model.Seconds(w), Truth(w), 0.02 * Truth(w));
  std::mt19937_64 rng(3);
  int slow = 0;
  for (int i = 0; i < 5000; ++i) slow += cal->target.model.Draw(w, rng) > 1.5 * Truth(w);  // 3 / 1.4 of it
  EXPECT_NEAR(slow / 5000.0, 0.2, 0.03);
  ASSERT_TRUE(cal->target.forwards.has_value());
  EXPECT_EQ(cal->target.forwards->size(), 2u);
  ASSERT_TRUE(cal->scheduler.has_value());
  EXPECT_EQ(cal->scheduler->num_blocks, 777);
  EXPECT_TRUE(cal->draft.has_value());
  EXPECT_NE(LoadStepCostFile(dir + "/cache.json").status().message().find("no \"shape\""), std::string::npos);
  EXPECT_TRUE(LoadStepCostFile(dir + "/cache.json", *NamedForwardShape("smollm2-135m")).ok());
  EXPECT_NE(LoadStepCostFile(dir + "/old.json").status().message().find("old.json: \"format\""), std::string::npos);
  EXPECT_EQ(cal->request_overhead_s, 0);
  EXPECT_EQ(LoadStepCostFile(dir + "/late.json")->request_overhead_s, 0.0003);
  EXPECT_EQ(LoadStepCostFile(dir + "/late.json")->arrival_s, 0.0002);
  EXPECT_EQ(LoadStepCostFile(dir + "/late.json")->arrival_token_ids_s, 0.0001);
  EXPECT_EQ(cal->arrival_s, 0);
  EXPECT_NE(LoadStepCostFile(dir + "/bad.json").status().message().find("\"request_overhead_s\" is not a number >= 0"),
            std::string::npos);
}

}  // namespace
}  // namespace specula
