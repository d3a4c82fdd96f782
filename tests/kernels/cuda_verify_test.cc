// Verification on the device (verify/backend_verify.h over the CUDA backend's Argmax, Sample and
// VerifyDrafts) against the CPU reference: greedy equality, and a chi-square test of device
// rejection sampling at p = 0.001 that catches a broken variant.
#include "tests/kernels/gpu_util.h"
#include "tests/verify/backend_verify_cases.h"

namespace specula {
namespace {

std::unique_ptr<Backend> Cuda() {
  auto be = MakeBackend({"cuda", "f32"});
  EXPECT_TRUE(be.ok()) << be.status();
  return be.ok() ? std::move(be).value() : nullptr;
}

TEST(CudaVerifyTest, GreedyMatchesTheHost) {
  SPECULA_REQUIRE_GPU();
  auto be = Cuda();
  ASSERT_NE(be, nullptr);
  for (int32_t vocab : {7, 1000, 32000, 128256}) testing::ExpectGreedyMatchesHost(*be, vocab, -1);
  testing::ExpectGreedyMatchesHost(*be, 128256, 0.8);
}

TEST(CudaVerifyTest, RejectionSamplingFollowsTheTarget) {
  SPECULA_REQUIRE_GPU();
  auto be = Cuda();
  ASSERT_NE(be, nullptr);
  const double chi2 = testing::FirstTokenChiSquare(*be, 16, 65536, false, false);
  const double broken = testing::FirstTokenChiSquare(*be, 16, 65536, false, true);
  const double plain = testing::FirstTokenChiSquare(*be, 16, 65536, true, false);
  std::printf("[gpu] chi-square (15 df, critical %.1f at p = 0.001): verification %.1f, plain sampling %.1f; "
              "told the wrong q: %.1f\n", testing::kChiSquare15At001, chi2, plain, broken);
  EXPECT_LT(chi2, testing::kChiSquare15At001);
  EXPECT_LT(plain, testing::kChiSquare15At001);
  EXPECT_GT(broken, testing::kChiSquare15At001);
}

}  // namespace
}  // namespace specula
