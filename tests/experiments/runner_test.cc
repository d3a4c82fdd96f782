// The runner in process on the tiny model: an ONLINE point with a burst window and record_trace
// writes one trace line per request at the arrivals that ArrivalTimes gives for the same options,
// and counts goodput per request against the spec's SLO.
#include "experiments/runner.h"
#include "experiments/draft_profile.h"
#include "experiments/step_periods.h"
#include "sim/fleet.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula::experiments {
namespace {

const std::string kModels = SPECULA_TEST_MODELS;

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// 24 requests at 10 req/s, 50 req/s in [0.5, 0.7) s. Requests alternate between 1 and 8 output
// tokens (ignore_eos). The TPOT bound of 0.1 us is one that no request of 8 tokens meets, while a
// request of one token has no TPOT and meets it: exactly half of the requests are good.
constexpr int kRequests = 24;
constexpr double kRate = 10, kBurstFactor = 5, kBurstStart = 0.5, kBurstDuration = 0.2, kTpotBoundMs = 1e-4;
constexpr uint64_t kSeed = 5;

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    std::ofstream(dir_ + "/prompts.jsonl") << "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1}\n"
                                              "{\"prompt\": \"The cat sat on the\", \"max_tokens\": 8}\n";
  }
  absl::StatusOr<LoadedSpec> Spec(const std::string& rest) const {
    return ParseSpec(dir_ + "/spec.textproto",
                     "model { path: \"" + kModels + "/stories260K.bin\" tokenizer: \"" + kModels + "/tok512.bin\" }\n"
                     "workload { prompts_file: \"prompts.jsonl\" num_requests: 24 max_tokens: 8 seed: 5 ignore_eos: true }\n" +
                         rest);
  }
  std::string dir_;
};

TEST_F(RunnerTest, OnlineBurstRecordsTheTraceAndGoodput) {
  auto spec = Spec("mode: ONLINE\nsweep { request_rate: [10] burst_factor: [5] }\n"
                   "burst_start_s: 0.5\nburst_duration_s: 0.2\nrecord_trace: true\n"
                   "slo { ttft_ms: 60000 tpot_ms: 0.0001 e2el_ms: 60000 }\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<Point> points = ExpandSweep(spec->spec);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].Json()["burst_factor"], kBurstFactor);
  EXPECT_EQ(points[0].Json()["burst_start_s"], kBurstStart);
  RunHooks hooks;
  hooks.trace_path = dir_ + "/trace.jsonl";
  auto m = RunPoint(*spec, points[0], hooks);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)["completed"], kRequests) << m->dump();

  // The arrivals the point's options give; without the burst they differ by far more than 50 ms,
  // so a runner that dropped the window fails below.
  ArrivalOptions a{.num_requests = kRequests, .request_rate = kRate, .burstiness = 1, .burst_factor = kBurstFactor,
                   .burst_start_s = kBurstStart, .burst_duration_s = kBurstDuration, .seed = kSeed};
  const std::vector<double> arrivals = ArrivalTimes(a);
  a.burst_factor = 1;
  const std::vector<double> steady = ArrivalTimes(a);
  EXPECT_GT(steady.back() - arrivals.back(), 0.3);

  const std::vector<nlohmann::json> trace = ReadLines(hooks.trace_path);
  ASSERT_EQ(trace.size(), static_cast<size_t>(kRequests));
  int good = 0;
  int64_t output_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    const nlohmann::json& t = trace[i];
    SCOPED_TRACE(t.dump());
    EXPECT_NEAR(t["arrival_s"].get<double>(), arrivals[i], 0.05);  // the send time is measured
    EXPECT_EQ(t["output_tokens"], i % 2 == 0 ? 1 : 8);
    EXPECT_GT(t["prompt_tokens"].get<int>(), 0);
    EXPECT_TRUE(t["prompt_text"].get<bool>());  // the prompts file's text, tokenized by the server
    EXPECT_FALSE(t.contains("drafts_found"));   // no n-gram proposer
    ASSERT_TRUE(t["ok"].get<bool>());
    EXPECT_FALSE(t.contains("error"));
    const double ttft = t["ttft_ms"], e2e = t["e2e_ms"];
    const int out = t["output_tokens"];
    EXPECT_NEAR(t["finish_s"].get<double>(), t["arrival_s"].get<double>() + e2e / 1e3, 1e-9);
    // The SLO per request, as the spec states it: one output token has no TPOT.
    const bool tpot_ok = out <= 1 || (e2e - ttft) / (out - 1) <= kTpotBoundMs;
    good += ttft <= 60000 && e2e <= 60000 && tpot_ok;
    output_tokens += out;
  }
  EXPECT_EQ(good, kRequests / 2);
  EXPECT_EQ((*m)["output_tokens"], output_tokens);
  const double goodput = (*m)["goodput"];
  EXPECT_GE(goodput, 0.0);
  EXPECT_LE(goodput, 1.0);
  EXPECT_DOUBLE_EQ(goodput, static_cast<double>(good) / kRequests);
  EXPECT_NEAR((*m)["request_goodput"].get<double>(), good / (*m)["duration_s"].get<double>(), 1e-9);
  // Written whole: no temporary file left beside it.
  EXPECT_FALSE(std::ifstream(hooks.trace_path + ".tmp").good());

  // The steps as they ran, beside the trace: every output token came from a step that scheduled its
  // sequence, and the periods fit in the run.
  const std::vector<nlohmann::json> steps = ReadLines(dir_ + "/trace.steps.jsonl");
  ASSERT_FALSE(steps.empty());
  double seqs = 0, seconds = 0, last_start = -1;
  for (const nlohmann::json& st : steps) {
    SCOPED_TRACE(st.dump());
    const std::string kind = st["kind"];
    EXPECT_TRUE(kind == "prefill" || kind == "decode") << kind;  // no speculation here
    EXPECT_GT(st["seconds"].get<double>(), 0);
    EXPECT_GE(st["tokens"].get<double>(), st["seqs"].get<double>());
    EXPECT_GE(st["start_s"].get<double>(), last_start);
    last_start = st["start_s"];
    seqs += st["seqs"].get<double>();
    seconds += st["seconds"].get<double>();
  }
  EXPECT_GE(seqs, static_cast<double>(output_tokens));
  EXPECT_LE(seconds, (*m)["duration_s"].get<double>() + 0.5);
  // One zero for the trace and the steps: the first step starts once the first request is sent and
  // before its first token reaches the client.
  const double first_start = steps.front()["start_s"], sent = trace[0]["arrival_s"];
  EXPECT_GE(first_start, sent);
  EXPECT_LE(first_start, sent + trace[0]["ttft_ms"].get<double>() / 1e3);
}

// A step's period: to the next step's start while the loop went straight on, else to its own end;
// an untimed step only bounds the one before it.
TEST(StepPeriods, RunToTheNextStartUnlessTheLoopIdled) {
  std::vector<std::pair<double, double>> out;  // {start, seconds}
  StepPeriods p([&](const StepPeriods::Step& s, double seconds) { out.push_back({s.start_s, seconds}); });
  p.Add({{}, "decode", 0.0, 1.0, true, true});
  p.Add({{}, "decode", 1.25, 2.0, false, true});  // the loop idled after it
  p.Add({{}, "decode", 5.0, 6.0, true, false});   // untimed
  p.Add({{}, "decode", 6.5, 7.0, true, true});
  p.Finish();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_DOUBLE_EQ(out[0].second, 1.25);
  EXPECT_DOUBLE_EQ(out[1].second, 0.75);
  EXPECT_EQ(out[2].first, 6.5);
  EXPECT_DOUBLE_EQ(out[2].second, 0.5);  // the last: to its own end
}

TEST_F(RunnerTest, WithoutAnSloGoodputIsTheCompletedShare) {
  auto spec = Spec("mode: ONLINE\nsweep { request_rate: [inf] }\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto m = RunPoint(*spec, ExpandSweep(spec->spec)[0], RunHooks{});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)["completed"], kRequests);
  EXPECT_EQ((*m)["goodput"], 1.0);
  EXPECT_FALSE(m->contains("trace"));
}

// A conversation in process: each turn's prompt holds the one before it and its answer, the prefix
// cache serves what the conversation sent before, the trace's lines carry "session" and "turn"
// (which the simulator reads), and the results line the statistics by turn.
TEST_F(RunnerTest, AConversationSendsEachAnswerBackAndTracesItsTurns) {
  auto spec = ParseSpec(dir_ + "/spec.textproto",
                        "model { path: \"" + kModels + "/stories260K.bin\" tokenizer: \"" + kModels + "/tok512.bin\" }\n"
                        "workload { conversation { sessions: 3 turns: 3 session_concurrency: 2 user_words: 20 } "
                        "max_tokens: 6 seed: 2 ignore_eos: true }\nmode: ONLINE\nrecord_trace: true\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<Point> points = ExpandSweep(spec->spec);
  ASSERT_EQ(points.size(), 1u);
  RunHooks hooks;
  hooks.trace_path = dir_ + "/trace.jsonl";
  auto m = RunPoint(*spec, points[0], hooks);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)["completed"], 9) << m->dump();
  EXPECT_EQ((*m)["sessions"]["completed"], 3);
  EXPECT_EQ((*m)["sessions"]["failed"], 0);
  EXPECT_EQ((*m)["output_tokens"], 9 * 6);
  ASSERT_EQ((*m)["per_turn"].size(), 3u);

  const std::vector<nlohmann::json> trace = ReadLines(hooks.trace_path);
  ASSERT_EQ(trace.size(), 9u);
  std::map<int, std::vector<nlohmann::json>> by_session;
  double last_arrival = 0;
  for (const nlohmann::json& t : trace) {
    SCOPED_TRACE(t.dump());
    EXPECT_GE(t["arrival_s"].get<double>(), last_arrival);  // in the order sent
    last_arrival = t["arrival_s"];
    EXPECT_EQ(t["session_id"], "s2-" + std::to_string(t["session"].get<int>()));
    EXPECT_TRUE(t["ok"].get<bool>());
    EXPECT_TRUE(t["prompt_text"].get<bool>());
    by_session[t["session"].get<int>()].push_back(t);
  }
  ASSERT_EQ(by_session.size(), 3u);
  for (auto& [session, turns] : by_session) {
    ASSERT_EQ(turns.size(), 3u);
    for (int t = 0; t < 3; ++t) {
      SCOPED_TRACE(turns[t].dump());
      EXPECT_EQ(turns[t]["turn"], t);
      EXPECT_EQ(turns[t]["output_tokens"], 6);
      if (t == 0) continue;
      // The history, the answer (6 tokens) and 20 new words: a prompt longer by more than the answer.
      const int before = turns[t - 1]["prompt_tokens"], now = turns[t]["prompt_tokens"];
      EXPECT_GT(now, before + 6 + 10);
      // The previous turn's prompt and answer are in the prefix cache, in whole blocks of 16.
      EXPECT_GE(turns[t]["cached_tokens"].get<int>(), (before + 6) / 16 * 16 - 16);
      EXPECT_GT(turns[t]["cached_tokens"].get<int>(), 0);
    }
  }
  const nlohmann::json& turn2 = (*m)["per_turn"][2];
  EXPECT_EQ(turn2["completed"], 3);
  EXPECT_GT(turn2["mean_cached_tokens"].get<double>(), 0);
  EXPECT_GT(turn2["mean_prompt_tokens"].get<double>(), (*m)["per_turn"][1]["mean_prompt_tokens"].get<double>());

  // The simulator reads the trace, each line with its session.
  auto replay = LoadTrace(hooks.trace_path);
  ASSERT_TRUE(replay.ok()) << replay.status();
  ASSERT_EQ(replay->size(), 9u);
  std::set<int64_t> sessions;
  for (const SimRequest& r : *replay) sessions.insert(r.session);
  EXPECT_EQ(sessions, (std::set<int64_t>{0, 1, 2}));
}

// A turn the server refuses (its prompt has outgrown the model's 512-token context) ends its
// conversation, and the run goes on to the end.
TEST_F(RunnerTest, AConversationThatOutgrowsTheContextEndsAloneNotTheRun) {
  auto spec = ParseSpec(dir_ + "/spec.textproto",
                        "model { path: \"" + kModels + "/stories260K.bin\" tokenizer: \"" + kModels + "/tok512.bin\" }\n"
                        "workload { conversation { sessions: 2 turns: 30 user_words: 40 } max_tokens: 4 }\nmode: ONLINE\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto m = RunPoint(*spec, ExpandSweep(spec->spec)[0], RunHooks{});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)["sessions"]["failed"], 2) << m->dump();
  EXPECT_EQ((*m)["failed"], 2);  // one turn each: the one refused
  EXPECT_GT((*m)["completed"].get<int>(), 4);
  EXPECT_LT((*m)["completed"].get<int>(), 60);
  ASSERT_FALSE((*m)["errors"].empty());
  EXPECT_NE((*m)["errors"][0].get<std::string>().find("longer than the context"), std::string::npos) << m->dump();
}

TEST_F(RunnerTest, AnOfflineRunRefusesATrace) {
  auto spec = Spec("mode: OFFLINE\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  RunHooks hooks;
  hooks.trace_path = dir_ + "/trace.jsonl";
  auto m = RunPoint(*spec, ExpandSweep(spec->spec)[0], hooks);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("record_trace needs mode: ONLINE"), std::string::npos) << m.status();
}

// The acceptance by position that the simulator replays: reached_per_position[i] counts the
// verifications of draft i after all before it were accepted, so that accepted / reached is draft
// i's conditional acceptance even where k varies by step.
TEST_F(RunnerTest, SpeculativeRunsCountTheDraftsEachPositionReached) {
  std::ofstream(dir_ + "/long.jsonl") << "{\"prompt\": \"Once upon a time\"}\n{\"prompt\": \"The cat sat on the\"}\n";
  auto spec = ParseSpec(dir_ + "/spec.textproto",
                        "model { path: \"" + kModels + "/stories260K.bin\" tokenizer: \"" + kModels + "/tok512.bin\" }\n"
                        "workload { prompts_file: \"long.jsonl\" num_requests: 6 max_tokens: 96 seed: 5 ignore_eos: true }\n"
                        "mode: OFFLINE\nsweep { spec_method: [\"ngram\"] num_spec_tokens: [4] }\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto m = RunPoint(*spec, ExpandSweep(spec->spec)[0], RunHooks{});
  ASSERT_TRUE(m.ok()) << m.status();
  const nlohmann::json& st = (*m)["spec"];
  const std::vector<int64_t> accepted = st["accepted_per_position"], reached = st["reached_per_position"];
  ASSERT_GT(st["drafts"].get<int64_t>(), 10) << st.dump();
  ASSERT_EQ(accepted.size(), reached.size());
  EXPECT_EQ(reached[0], st["drafts"].get<int64_t>());  // every verification verifies its first draft
  int64_t sum = 0;
  for (size_t i = 0; i < reached.size(); ++i) {
    EXPECT_LE(accepted[i], reached[i]) << i;
    if (i > 0) {
      EXPECT_LE(reached[i], accepted[i - 1]) << i;  // reached only past an accepted draft
    }
    sum += accepted[i];
  }
  EXPECT_EQ(sum, st["accepted_tokens"].get<int64_t>());
}

// The lookup's drafts at each step, worked by hand: after g output tokens it matches the longest
// suffix (4 tokens down to 2) against an earlier occurrence and proposes what followed it.
TEST(DraftProfile, RecordsWhatTheLookupFoundAndTheOutputMatched) {
  const NgramProposer lookup(2, 4);
  const std::vector<TokenId> prompt = {5, 6, 7, 8, 5, 6}, output = {7, 9, 5, 6, 7, 1};
  DraftProfile p = NgramDraftProfile(lookup, prompt, output, 4);
  // g = 1: [5 6 7] recurs at 0, so 8 5 6 7 (the output has 9 next); g = 2, 3: no suffix recurs;
  // g = 4: [5 6] at 4, so 7 9 5 6 (7 then 1 came); g = 5: [5 6 7] at 4, so 9 5 6 7 (1 came).
  EXPECT_EQ(p.found, (std::vector<int32_t>{4, 0, 0, 4, 4}));
  EXPECT_EQ(p.matched, (std::vector<int32_t>{0, 0, 0, 1, 0}));
  p = NgramDraftProfile(lookup, prompt, output, 2);
  EXPECT_EQ(p.found, (std::vector<int32_t>{2, 0, 0, 2, 2}));
  EXPECT_EQ(p.matched, (std::vector<int32_t>{0, 0, 0, 1, 0}));
  EXPECT_TRUE(NgramDraftProfile(lookup, prompt, {3}, 4).found.empty());  // one token: no decode step
}

// An n-gram point's trace carries each request's profile, and under a fixed k the profiles replayed
// through the scheduler's cap (no drafts past max_tokens) give the run's own draft and accepted
// counts exactly: the simulator replays the acceptance of a greedy n-gram run step for step.
TEST_F(RunnerTest, AnNgramTraceReplaysTheRunsDraftsExactly) {
  std::ofstream(dir_ + "/long.jsonl") << "{\"prompt\": \"Once upon a time\"}\n{\"prompt\": \"The cat sat on the\"}\n";
  constexpr int32_t kK = 3, kMaxTokens = 80;
  auto spec = ParseSpec(dir_ + "/spec.textproto",
                        "model { path: \"" + kModels + "/stories260K.bin\" tokenizer: \"" + kModels + "/tok512.bin\" }\n"
                        "workload { prompts_file: \"long.jsonl\" num_requests: 6 max_tokens: 80 seed: 5 ignore_eos: true }\n"
                        "mode: ONLINE\nsweep { spec_method: [\"ngram\"] num_spec_tokens: [3] request_rate: [50] }\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  RunHooks hooks;
  hooks.trace_path = dir_ + "/ngram.jsonl";
  auto m = RunPoint(*spec, ExpandSweep(spec->spec)[0], hooks);
  ASSERT_TRUE(m.ok()) << m.status();
  int64_t drafts = 0, accepted = 0;
  for (const nlohmann::json& line : ReadLines(hooks.trace_path)) {
    ASSERT_TRUE(line.contains("drafts_found")) << line.dump();
    const std::vector<int32_t> found = line["drafts_found"], matched = line["drafts_matched"];
    ASSERT_EQ(found.size(), kMaxTokens - 1u);
    for (int32_t g = 1; g < kMaxTokens;) {
      const int32_t d = std::min({kK, kMaxTokens - g - 1, found[g - 1]});
      const int32_t a = std::min(d, matched[g - 1]);
      drafts += d;
      accepted += a;
      g += a + 1;
    }
  }
  EXPECT_GT(accepted, 20);  // the tiny model repeats itself: n-gram drafts are accepted
  EXPECT_EQ(drafts, (*m)["spec"]["draft_tokens"].get<int64_t>());
  EXPECT_EQ(accepted, (*m)["spec"]["accepted_tokens"].get<int64_t>());
}

}  // namespace
}  // namespace specula::experiments
