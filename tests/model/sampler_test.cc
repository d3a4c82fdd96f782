#include "model/sampler.h"

#include <cmath>
#include <algorithm>
#include <map>
#include <random>

#include "core/categorical.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};  // [vocab 5]

std::vector<float> Probs(const SamplingParams& p, std::vector<TokenId> history = {}) {
  std::vector<float> out;
  Sampler(p).Probabilities(kLogits, history, &out);
  return out;
}

TEST(SamplerTest, GreedyPicksArgmax) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(kLogits, {}), 1);
  EXPECT_EQ(Probs({}), (std::vector<float>{0, 1, 0, 0, 0}));
}

// Greedy sampling (a shortcut past the distribution) picks the token the one-hot distribution puts
// its mass on, ties going to the lowest index, with and without a repetition penalty.
TEST(SamplerTest, GreedySampleMatchesItsDistribution) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(1 + rng() % 40);  // [vocab]
    for (float& l : logits) l = static_cast<float>(static_cast<int>(rng() % 7) - 3);  // many ties
    for (float penalty : {1.0f, 1.3f}) {
      SamplingParams p;
      p.repetition_penalty = penalty;
      const std::vector<TokenId> history = {0, static_cast<TokenId>(logits.size() - 1)};
      std::vector<float> probs;
      Sampler s(p);
      s.Probabilities(logits, history, &probs);
      const auto hot = std::find(probs.begin(), probs.end(), 1.0f) - probs.begin();
      ASSERT_EQ(s.Sample(logits, history), hot) << "trial " << trial << " penalty " << penalty;
      const auto first_max = std::max_element(logits.begin(), logits.end()) - logits.begin();
      if (penalty == 1.0f) {
        ASSERT_EQ(hot, first_max) << "trial " << trial;
      }
    }
  }
}

TEST(SamplerTest, TemperatureIsSoftmaxOfScaledLogits) {
  SamplingParams p;
  p.temperature = 0.5f;
  const auto probs = Probs(p);
  double z = 0;
  for (float l : kLogits) z += std::exp(l / 0.5);
  for (size_t i = 0; i < kLogits.size(); ++i) EXPECT_NEAR(probs[i], std::exp(kLogits[i] / 0.5) / z, 1e-6);
}

TEST(SamplerTest, TopKTopPMinPKeepTheRightTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  auto probs = Probs(p);
  EXPECT_GT(probs[1], 0);
  EXPECT_GT(probs[4], 0);
  EXPECT_EQ(probs[0] + probs[2] + probs[3], 0.0f);
  EXPECT_NEAR(probs[1] + probs[4], 1.0, 1e-6);

  p.top_k = 0;
  p.top_p = 0.5f;  // p(1) ~ 0.39, p(4) ~ 0.35: both are needed to reach 0.5
  probs = Probs(p);
  EXPECT_GT(probs[1], 0);
  EXPECT_GT(probs[4], 0);
  EXPECT_EQ(probs[2], 0.0f);

  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: 1, 4, and 2 (e^-1 = 0.37 < 0.5: dropped)
  probs = Probs(p);
  EXPECT_GT(probs[1], 0);
  EXPECT_GT(probs[4], 0);
  EXPECT_EQ(probs[2], 0.0f);
  EXPECT_EQ(probs[0], 0.0f);
}

TEST(SamplerTest, RepetitionPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;  // logit 3.0 -> 1.5, below 2.9
  Sampler s(p);
  EXPECT_EQ(s.Sample(kLogits, {1}), 4);
}

TEST(SamplerTest, SeedMakesRunsReproducibleAndFrequenciesMatch) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  std::map<TokenId, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const TokenId x = a.Sample(kLogits, {});
    ASSERT_EQ(x, b.Sample(kLogits, {}));
    counts[x]++;
  }
  const auto probs = Probs(p);
  for (int t = 0; t < 5; ++t) {
    const double sd = std::sqrt(n * probs[t] * (1 - probs[t]));
    EXPECT_NEAR(counts[t], n * probs[t], 5 * sd + 1) << "token " << t;
  }
}

TEST(SamplerTest, InvalidParamsAreRejected) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_p = 0;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.min_p = 2;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_k = -3;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_k"), std::string::npos);
}

}  // namespace
}  // namespace specula
