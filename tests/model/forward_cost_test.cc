// The forward cost tables (model/forward_cost.h) count the work they time: a verification-sized
// shape is run with a logits row per token (as the engine's verifications are, and as the
// controller counts their work), a larger one with a row a sequence (a prefill chunk's).
#include "model/forward_cost.h"

#include <memory>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/make_model.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace specula {
namespace {

std::unique_ptr<LlamaModel> TinyModel() {
  ModelConfig c = *NamedShape("tiny");
  c.num_layers = 1;
  const std::string dir = testing::MakeTempDir();
  EXPECT_TRUE(WriteRandomModel(c, dir, DType::kF32, 3).ok());
  auto w = LoadModel(dir);
  EXPECT_TRUE(w.ok()) << w.status();
  return std::make_unique<LlamaModel>(std::move(w).value(), MakeCpuBackend({}));
}

TEST(ForwardCostTest, VerificationShapesCountALogitsRowPerToken) {
  std::unique_ptr<LlamaModel> model = TinyModel();
  const ModelConfig& c = model->config();
  auto points = MeasureForwardCost(*model, CostGrid{1, 16, 30.0, 64});
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 7u);  // 1, 2, ..., 64 tokens on one sequence
  for (const CostPoint& p : *points) {
    const int32_t rows = p.tokens <= 16 ? p.tokens : 1;  // past 16, a prefill chunk's one row
    EXPECT_DOUBLE_EQ(p.flops, ForwardFlops(c, p.tokens, rows, AttendedPositions(32, p.tokens))) << p.tokens;
    EXPECT_GT(p.seconds, 0) << p.tokens;
  }
}

}  // namespace
}  // namespace specula
