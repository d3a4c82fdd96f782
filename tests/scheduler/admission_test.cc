// Admission decisions on hand-made queue states and clocks (seconds are arguments, not real time).
#include "scheduler/admission.h"

#include <gtest/gtest.h>

namespace specula {
namespace {

TEST(AdmissionTest, QueueLengthRefusesAtTheLimit) {
  AdmissionConfig c;
  c.max_queue_len = 4;
  Admission a(c);
  std::string detail;
  EXPECT_EQ(a.Check(0, QueueState{3, 0, 0}, 0, &detail), "");
  EXPECT_EQ(a.Check(0, QueueState{4, 0, 0}, 0, &detail), "queue_len");
  EXPECT_NE(detail.find("4 requests queued (--max-queue-len 4)"), std::string::npos) << detail;
}

TEST(AdmissionTest, QueueDelayIsPredictedFromTheCompletionRate) {
  AdmissionConfig c;
  c.max_queue_delay_ms = 1000;
  Admission a(c);
  std::string detail;
  // No completions yet: nothing to predict from, admitted.
  EXPECT_EQ(a.PredictDelayMs(QueueState{50, 0, 0}, 0), -1);
  EXPECT_EQ(a.Check(0, QueueState{50, 0, 0}, 0, &detail), "");
  for (int i = 1; i <= 20; ++i) a.ObserveCompletion(i * 0.1);  // 10 per second over 2 s
  // 20 queued, no free slot: 21 completions needed at ~10/s, ~2.1 s.
  EXPECT_NEAR(a.PredictDelayMs(QueueState{20, 0, 0}, 2.0), 2100, 120);
  EXPECT_EQ(a.Check(0, QueueState{20, 0, 0}, 2.0, &detail), "queue_delay");
  EXPECT_NE(detail.find("predicted queueing delay"), std::string::npos);
  // 4 queued: ~0.5 s, admitted. A free slot for each: no wait.
  EXPECT_EQ(a.Check(0, QueueState{4, 0, 0}, 2.0, &detail), "");
  EXPECT_EQ(a.PredictDelayMs(QueueState{3, 8, 0}, 2.0), 0);
  // What the oldest queued request has already waited is a floor.
  EXPECT_EQ(a.Check(0, QueueState{3, 8, 1500}, 2.0, &detail), "queue_delay");
}

TEST(AdmissionTest, CompletionsOutsideTheWindowAreForgotten) {
  AdmissionConfig c;
  c.max_queue_delay_ms = 1000;
  Admission a(c);
  for (int i = 1; i <= 20; ++i) a.ObserveCompletion(i * 0.1);
  // 30 s later nothing completed for 10 s: no rate to predict from.
  EXPECT_EQ(a.PredictDelayMs(QueueState{20, 0, 0}, 32.0), -1);
}

TEST(AdmissionTest, TtftBreakerShedsLowerPrioritiesUntilItRecovers) {
  AdmissionConfig c;
  c.ttft_slo_ms = 200;
  Admission a(c);
  std::string detail;
  for (int i = 0; i < 9; ++i) a.ObserveTtft(1.0, 900);
  // Too few samples to judge: closed.
  EXPECT_EQ(a.Check(1, QueueState{}, 1.0, &detail), "");
  a.ObserveTtft(1.0, 900);
  EXPECT_DOUBLE_EQ(a.P99TtftMs(1.0), 900);
  EXPECT_EQ(a.Check(1, QueueState{}, 1.0, &detail), "ttft_slo");
  EXPECT_NE(detail.find("P99 TTFT of the last 10 s is 900 ms (--ttft-slo-ms 200)"), std::string::npos) << detail;
  // The highest priority is never shed.
  EXPECT_EQ(a.Check(0, QueueState{}, 1.0, &detail), "");
  // 99 fast requests and one slow: the P99 is fast, the breaker closes.
  for (int i = 0; i < 990; ++i) a.ObserveTtft(2.0, 50);
  EXPECT_DOUBLE_EQ(a.P99TtftMs(2.0), 50);
  EXPECT_EQ(a.Check(1, QueueState{}, 2.0, &detail), "");
  // Slow again, then the window passes without requests: closed.
  for (int i = 0; i < 2000; ++i) a.ObserveTtft(3.0, 5000);
  EXPECT_EQ(a.Check(1, QueueState{}, 3.0, &detail), "ttft_slo");
  EXPECT_EQ(a.Check(1, QueueState{}, 13.5, &detail), "");
}

}  // namespace
}  // namespace specula
