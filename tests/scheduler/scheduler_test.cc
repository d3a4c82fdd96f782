// Table-driven scheduler tests with a fake model step (in the style of TensorRT-LLM's
// capacitySchedulerTest): each scenario lists requests and the exact plan of every step, written
// "id:start+count" with "*" when the step samples a token. After every scenario all reference
// counts are back to zero.
#include "scheduler/scheduler.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/scheduler/fake_step.h"

namespace specula {
namespace {

using testing::FakeStep;
using testing::Prompt;

std::string Render(const StepPlan& p) {
  std::vector<std::string> parts;
  for (const auto& s : p.seqs) parts.push_back(absl::StrCat(s.id, ":", s.start_pos, "+", s.num_tokens, s.samples ? "*" : ""));
  for (RequestId id : p.preempted) parts.push_back(absl::StrCat("preempt ", id));
  return absl::StrJoin(parts, " ");
}

struct Req {
  RequestId id;
  std::vector<TokenId> prompt;
  int32_t max_new;
  int32_t priority = 0;
};

struct Scenario {
  const char* name;
  SchedulerConfig config;
  std::vector<Req> requests;
  std::vector<std::string> steps;  // expected plans; the run must then be finished
  int64_t want_preemptions = 0;
};

SchedulerConfig Config(int32_t budget, int32_t max_seqs, int32_t block, int32_t blocks, bool caching = false,
                       SchedulingPolicy policy = SchedulingPolicy::kFcfs) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.block_size = block;
  c.num_blocks = blocks;
  c.enable_prefix_caching = caching;
  c.max_model_len = 1024;
  c.policy = policy;
  return c;
}

void ExpectAllBlocksReturned(const Scheduler& s, const std::string& name) {
  EXPECT_TRUE(s.CheckInvariants().ok()) << name << ": " << s.CheckInvariants();
  EXPECT_EQ(s.blocks().num_available(), s.blocks().num_blocks()) << name;
  for (BlockId b = 0; b < s.blocks().num_blocks(); ++b) ASSERT_EQ(s.blocks().ref_count(b), 0) << name;
}

TEST(SchedulerTableTest, Scenarios) {
  const std::vector<Scenario> scenarios = {
      {"token budget splits prompts into chunks",
       Config(16, 8, 4, 64),
       {{1, Prompt(10), 3}, {2, Prompt(10), 3}, {3, Prompt(5), 2}},
       {"1:0+10* 2:0+6", "1:10+1* 2:6+4* 3:0+5*", "1:11+1* 2:10+1* 3:5+1*", "2:11+1*"}},
      {"sequence budget holds the third request back",
       Config(64, 2, 4, 64),
       {{1, Prompt(4), 2}, {2, Prompt(4), 2}, {3, Prompt(4), 2}},
       {"1:0+4* 2:0+4*", "1:4+1* 2:4+1*", "3:0+4*", "3:4+1*"}},
      {"chunked prefill mixed with decodes",
       Config(8, 4, 4, 64),
       {{1, Prompt(3), 5}, {2, Prompt(20), 1}},
       {"1:0+3* 2:0+5", "1:3+1* 2:5+7", "1:4+1* 2:12+7", "1:5+1* 2:19+1*", "1:6+1*"}},
      {"preemption by recomputation, then resume",
       Config(64, 4, 4, 5),
       {{1, Prompt(8), 8}, {2, Prompt(8, 1), 8}},
       {"1:0+8* 2:0+8*", "1:8+1* preempt 2", "1:9+1*", "1:10+1*", "1:11+1*", "1:12+1*", "1:13+1*",
        "1:14+1*", "2:0+9*", "2:9+1*", "2:10+1*", "2:11+1*", "2:12+1*", "2:13+1*", "2:14+1*"},
       1},
      {"priority policy serves the urgent request first and preempts the other",
       Config(64, 4, 4, 5, false, SchedulingPolicy::kPriority),
       {{1, Prompt(8), 3, 5}, {2, Prompt(8, 1), 3, 0}},
       {"2:0+8* 1:0+8*", "2:8+1* preempt 1", "2:9+1*", "1:0+9*", "1:9+1*"},
       1},
  };
  for (const Scenario& sc : scenarios) {
    testing::TestScheduler s(sc.config);
    for (const Req& r : sc.requests) {
      ASSERT_TRUE(s.Add({r.id, r.prompt, r.max_new, {testing::kStop}, r.priority, 0.0}).ok()) << sc.name;
    }
    for (size_t i = 0; i < sc.steps.size(); ++i) {
      EXPECT_EQ(Render(FakeStep(s)), sc.steps[i]) << sc.name << ", step " << i;
      ASSERT_TRUE(s.CheckInvariants().ok()) << sc.name << ", step " << i << ": " << s.CheckInvariants();
    }
    EXPECT_FALSE(s.HasUnfinished()) << sc.name;
    EXPECT_EQ(s.num_preemptions(), sc.want_preemptions) << sc.name;
    // Tokens depend only on (id, position): preemption and chunking never change them.
    for (const Req& r : sc.requests) {
      const SequenceState* st = s.Get(r.id);
      ASSERT_NE(st, nullptr);
      EXPECT_EQ(st->finish, FinishReason::kMaxTokens) << sc.name;
      ASSERT_EQ(st->num_generated(), r.max_new) << sc.name;
      for (int32_t k = 0; k < r.max_new; ++k) {
        const int32_t pos = static_cast<int32_t>(r.prompt.size()) + k;
        EXPECT_EQ(st->tokens[pos], testing::FakeToken(r.id, pos)) << sc.name;
      }
    }
    ExpectAllBlocksReturned(s, sc.name);
  }
}

TEST(SchedulerPrefixCacheTest, HitsPartialHitsAndEviction) {
  struct Case {
    const char* name;
    std::vector<TokenId> prompt;
    std::string first_plan;
  };
  const std::vector<TokenId> base = Prompt(12);
  std::vector<TokenId> longer = base;
  longer.insert(longer.end(), {7, 8});
  std::vector<TokenId> partial = longer;
  partial[6] = 99;
  const std::vector<Case> cases = {
      {"full prefix hit", longer, "2:12+2*"},
      {"partial hit (second block differs)", partial, "2:4+10*"},
      {"identical prompt: last block recomputed for its logits", base, "2:8+4*"},
      {"miss", Prompt(14, 5), "2:0+14*"},
  };
  for (const Case& c : cases) {
    testing::TestScheduler s(Config(64, 4, 4, 32, true));
    ASSERT_TRUE(s.Add({1, base, 2, {}, 0, 0}).ok());
    while (s.HasUnfinished()) FakeStep(s);
    ASSERT_TRUE(s.Add({2, c.prompt, 2, {}, 0, 0}).ok());
    EXPECT_EQ(Render(FakeStep(s)), c.first_plan) << c.name;
    while (s.HasUnfinished()) FakeStep(s);
    EXPECT_GT(s.blocks().query_tokens(), 0);
    ExpectAllBlocksReturned(s, c.name);
  }
  // Eviction: a finished request's cached blocks are reused for a new one, then its prefix misses.
  testing::TestScheduler s(Config(64, 4, 4, 6, true));
  ASSERT_TRUE(s.Add({1, Prompt(8), 1, {}, 0, 0}).ok());
  while (s.HasUnfinished()) FakeStep(s);
  ASSERT_TRUE(s.Add({2, Prompt(20, 3), 1, {}, 0, 0}).ok());  // needs 5 of 6 blocks: evicts one
  while (s.HasUnfinished()) FakeStep(s);
  ASSERT_TRUE(s.Add({3, Prompt(8), 1, {}, 0, 0}).ok());
  EXPECT_EQ(Render(FakeStep(s)), "3:0+8*");  // the LRU block (its first) was evicted
  ExpectAllBlocksReturned(s, "eviction");
}

TEST(SchedulerAbortTest, AbortInEveryState) {
  using Pred = std::function<bool(const SequenceState&)>;
  struct Case {
    const char* name;
    Pred reached;  // step until request 9 is in this state, then abort it
  };
  const std::vector<Case> cases = {
      {"waiting", [](const SequenceState& s) { return s.status == SeqStatus::kWaiting; }},
      {"running, mid-prefill",
       [](const SequenceState& s) { return s.status == SeqStatus::kRunning && s.num_computed < s.num_prompt; }},
      {"running, decoding",
       [](const SequenceState& s) { return s.status == SeqStatus::kRunning && s.num_generated() >= 2; }},
      {"preempted (waiting again)",
       [](const SequenceState& s) { return s.status == SeqStatus::kWaiting && s.num_preemptions > 0; }},
      {"finished", [](const SequenceState& s) { return s.status == SeqStatus::kFinished; }},
  };
  for (const Case& c : cases) {
    // Request 1 arrives first and grows; the tight pool then preempts request 9.
    testing::TestScheduler s(Config(6, 4, 2, 10));
    ASSERT_TRUE(s.Add({1, Prompt(4), 14, {}, 0, 0}).ok());
    ASSERT_TRUE(s.Add({9, Prompt(8, 2), 6, {}, 0, 0}).ok());
    int steps = 0;
    while (!c.reached(*s.Get(9))) {
      ASSERT_LT(++steps, 100) << c.name << ": state never reached";
      FakeStep(s);
    }
    const bool was_finished = s.Get(9)->status == SeqStatus::kFinished;
    s.Finish(9, FinishReason::kAborted);
    ASSERT_TRUE(s.CheckInvariants().ok()) << c.name;
    EXPECT_EQ(s.Get(9)->status, SeqStatus::kFinished);
    EXPECT_EQ(s.Get(9)->finish, was_finished ? FinishReason::kMaxTokens : FinishReason::kAborted) << c.name;
    while (s.HasUnfinished()) FakeStep(s);
    EXPECT_EQ(s.Get(1)->num_generated(), 14) << c.name;  // the other request is unaffected
    ExpectAllBlocksReturned(s, c.name);
  }
}

TEST(SchedulerTest, StopTokenFinishesAndBatchingWindowWaits) {
  SchedulerConfig c = Config(64, 4, 4, 64);
  c.max_wait_ms = 10;
  testing::TestScheduler s(c);
  ASSERT_TRUE(s.Add({1, Prompt(4), 5, {testing::FakeToken(1, 5)}, 0, 100.0}).ok());
  StepPlan p = s.Schedule(104.0);  // window open for 6 more ms
  EXPECT_TRUE(p.seqs.empty());
  EXPECT_NEAR(p.wait_ms, 6.0, 1e-9);
  EXPECT_EQ(Render(FakeStep(s, 110.0)), "1:0+4*");
  EXPECT_EQ(Render(FakeStep(s, 111.0)), "1:4+1*");  // samples FakeToken(1, 5): the stop token
  EXPECT_FALSE(s.HasUnfinished());
  EXPECT_EQ(s.Get(1)->finish, FinishReason::kStopToken);
}

TEST(SchedulerTest, RejectsRequestsThatCanNeverRun) {
  testing::TestScheduler s(Config(64, 4, 4, 4));
  EXPECT_EQ(s.Add({1, Prompt(20), 10, {}, 0, 0}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Add({2, {}, 10, {}, 0, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add({3, Prompt(2000), 1, {}, 0, 0}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Add({4, Prompt(4), 2, {}, 0, 0}).ok());
  SchedulerConfig bad = Config(0, 4, 4, 4);
  EXPECT_NE(ValidateSchedulerConfig(bad).message().find("max_num_batched_tokens"), std::string::npos);
}

// Adaptive speculation lowers a sequence's draft slots after Schedule (StepPlan::SetNumSpec): the
// step then brings fewer tokens, and the lookahead blocks reserved for the rest come back in Update.
TEST(SchedulerTest, DraftSlotsLoweredAfterScheduleAreGivenBack) {
  SchedulerConfig c = Config(64, 4, 4, 16);
  c.num_spec_tokens = 8;
  testing::TestScheduler s(c);
  ASSERT_TRUE(s.Add({1, Prompt(3), 20, {}, 0, 0}).ok());
  StepPlan prefill = s.Schedule(0);
  ASSERT_EQ(Render(prefill), "1:0+3*");
  s.Update(prefill, {{{1, {7}, 0}}});
  StepPlan p = s.Schedule(0);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_spec, 8);
  EXPECT_EQ(p.num_batched_tokens, 9);
  EXPECT_EQ(s.Get(1)->blocks.size(), 3u);  // positions 0..11: the known token and 8 lookahead slots
  for (int32_t k : {8, 3, 0}) {
    StepPlan q = p;
    q.SetNumSpec(0, k);
    EXPECT_EQ(q.seqs[0].num_tokens, 1 + k);
    EXPECT_EQ(q.num_batched_tokens, 1 + k);
  }
  p.SetNumSpec(0, 0);
  s.Update(p, {{{1, {8}, 0}}});  // a plain decode step
  EXPECT_EQ(s.Get(1)->num_computed, 4);
  EXPECT_EQ(s.Get(1)->blocks.size(), 2u);  // 5 tokens: the third block is back
  EXPECT_TRUE(s.CheckInvariants().ok());
  EXPECT_EQ(s.blocks().num_available(), 14);
  s.Finish(1, FinishReason::kAborted);
  ExpectAllBlocksReturned(s, "lowered draft slots");
}

}  // namespace
}  // namespace specula
