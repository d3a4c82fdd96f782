// BackendVerifier on the CPU backend (whose memory is the host's) against the host's Verify: the
// device path's logic, checked in every CI run. tests/kernels/cuda_verify_test.cc runs the same
// cases on a GPU.
#include "kernels/make_backend.h"
#include "tests/verify/backend_verify_cases.h"

namespace specula {
namespace {

std::unique_ptr<Backend> Cpu() {
  auto be = MakeBackend({"cpu", "f32"});
  EXPECT_TRUE(be.ok()) << be.status();
  return std::move(be).value();
}

TEST(BackendVerifyTest, GreedyAndHostRoutedSequencesMatchTheHost) {
  auto be = Cpu();
  for (int32_t vocab : {7, 1000}) testing::ExpectGreedyMatchesHost(*be, vocab, -1);
}

TEST(BackendVerifyTest, SyntheticAcceptanceTakesTheHostsDraws) {
  auto be = Cpu();
  testing::ExpectGreedyMatchesHost(*be, 1000, 0.8);
}

TEST(BackendVerifyTest, RejectionSamplingFollowsTheTarget) {
  auto be = Cpu();
  const double chi2 = testing::FirstTokenChiSquare(*be, 16, 16384, false, false);
  EXPECT_LT(chi2, testing::kChiSquare15At001);
  // A verifier told the wrong draft distribution is caught by the same statistic.
  const double broken = testing::FirstTokenChiSquare(*be, 16, 16384, false, true);
  EXPECT_GT(broken, testing::kChiSquare15At001);
  std::printf("chi-square (15 df, critical %.1f at p = 0.001): %.1f; told the wrong q: %.1f\n",
              testing::kChiSquare15At001, chi2, broken);
}

TEST(BackendVerifyTest, PlainSamplingFollowsTheTarget) {
  auto be = Cpu();
  EXPECT_LT(testing::FirstTokenChiSquare(*be, 16, 16384, true, false), testing::kChiSquare15At001);
}

}  // namespace
}  // namespace specula
