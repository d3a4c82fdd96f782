// Randomized property test: thousands of random add / step / abort operations; after every step
// no block is leaked or owned twice, budgets hold, and every request eventually finishes.
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "tests/scheduler/fake_step.h"

namespace specula {
namespace {

TEST(SchedulerPropertyTest, RandomAddStepAbort) {
  std::mt19937 rng(1234);
  int64_t total_steps = 0, total_preemptions = 0, total_requests = 0;
  for (int trial = 0; trial < 40; ++trial) {
    SchedulerConfig c;
    c.block_size = 1 + rng() % 8;
    c.num_blocks = 8 + rng() % 64;
    c.max_num_seqs = 1 + rng() % 8;
    c.max_num_batched_tokens = 4 + rng() % 64;
    c.max_model_len = 256;
    c.enable_prefix_caching = rng() % 2;
    c.policy = rng() % 2 ? SchedulingPolicy::kFcfs : SchedulingPolicy::kPriority;
    testing::TestScheduler s(c);
    RequestId next = 0;
    std::set<RequestId> live;
    for (int op = 0; op < 400 || s.HasUnfinished(); ++op) {
      ASSERT_LT(op, 20000) << "requests did not finish (starvation?) in trial " << trial;
      const int r = rng() % 10;
      if (op < 400 && r < 3) {
        // Shared prefixes make prefix-cache hits likely.
        std::vector<TokenId> prompt = testing::Prompt(1 + rng() % 40, rng() % 3);
        const int32_t max_new = 1 + rng() % 20;
        auto st = s.Add({next, prompt, max_new, {testing::kStop}, static_cast<int32_t>(rng() % 3), 0});
        if (st.ok()) {
          live.insert(next);
          ++total_requests;
        } else {
          ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
        }
        ++next;
      } else if (op < 400 && r == 3 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        s.Finish(*it, FinishReason::kAborted);
        live.erase(it);
      } else {
        const StepPlan plan = testing::FakeStep(s);
        ++total_steps;
        ASSERT_LE(plan.num_batched_tokens, c.max_num_batched_tokens);
        ASSERT_LE(static_cast<int32_t>(plan.seqs.size()), c.max_num_seqs);
        std::set<RequestId> ids;
        int32_t sum = 0;
        for (const auto& q : plan.seqs) {
          ASSERT_TRUE(ids.insert(q.id).second) << "scheduled twice";
          ASSERT_GT(q.num_tokens, 0);
          sum += q.num_tokens;
        }
        ASSERT_EQ(sum, plan.num_batched_tokens);
        if (s.HasUnfinished()) {
          ASSERT_FALSE(plan.seqs.empty()) << "a step with work scheduled nothing";
        }
      }
      ASSERT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants() << " trial " << trial << " op " << op;
      for (auto it = live.begin(); it != live.end();) {
        it = s.Get(*it)->status == SeqStatus::kFinished ? live.erase(it) : std::next(it);
      }
    }
    EXPECT_EQ(s.blocks().num_available(), c.num_blocks) << "trial " << trial;
    total_preemptions += s.num_preemptions();
  }
  std::printf("[property] %lld requests, %lld steps, %lld preemptions\n", static_cast<long long>(total_requests),
              static_cast<long long>(total_steps), static_cast<long long>(total_preemptions));
  EXPECT_GT(total_preemptions, 0);
}

}  // namespace
}  // namespace specula
