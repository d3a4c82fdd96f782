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

// Top-k and top-p as a full stable sort of the vocabulary by descending probability defines them
// (the implementation sorts only the prefix it keeps): which tokens are kept, from the
// probabilities after temperature. `total` summed in sorted order, as the full sort did.
std::vector<bool> KeptByFullSort(const std::vector<float>& probs, int32_t top_k, float top_p) {
  const int32_t n = static_cast<int32_t>(probs.size());
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  int32_t keep = top_k > 0 && top_k < n ? top_k : n;
  if (top_p < 1.0f) {
    double total = 0.0, mass = 0.0;
    for (int32_t i = 0; i < keep; ++i) total += probs[order[i]];
    int32_t i = 0;
    while (i < keep) {
      mass += probs[order[i++]];
      if (mass >= top_p * total) break;
    }
    keep = i;
  }
  std::vector<bool> kept(n, false);
  for (int32_t i = 0; i < keep; ++i) kept[order[i]] = true;
  return kept;
}

TEST(SamplerTest, TopKAndTopPKeepWhatAFullSortKeeps) {
  std::mt19937 rng(3);
  int32_t rows = 0, kept_far_down = 0, cut_in_ties = 0;
  for (int32_t n : {1, 2, 7, 63, 64, 65, 300, 5000, 32000}) {
    for (int32_t trial = 0; trial < 6; ++trial) {
      // Logits on a coarse grid for many equal probabilities (ties go to the lower id); steep rows
      // where top-k and top-p reach tokens far less likely than the first.
      const float spread = trial % 3 == 0 ? 8.0f : trial % 3 == 1 ? 2.0f : 0.2f;
      std::vector<float> logits(n);
      for (float& l : logits) l = std::round(std::normal_distribution<float>(0, spread)(rng) * 4) / 4;
      SamplingParams p;
      p.temperature = 0.8f;
      std::vector<float> soft, got;  // [n] at temperature alone, and with top-k / top-p
      SamplingProbabilities(p, logits, {}, &soft);
      const float most = *std::max_element(soft.begin(), soft.end());
      for (int32_t top_k : {0, 1, 3, 40, 1000}) {
        for (float top_p : {1.0f, 0.95f, 0.5f, 0.1f}) {
          p.top_k = top_k;
          p.top_p = top_p;
          SamplingProbabilities(p, logits, {}, &got);
          const std::vector<bool> want = KeptByFullSort(soft, top_k, top_p);
          bool far_down = false;
          for (int32_t i = 0; i < n; ++i) {
            ASSERT_EQ(got[i] > 0.0f, want[i]) << "n " << n << " trial " << trial << " top_k " << top_k << " top_p "
                                             << top_p << " token " << i;
            far_down |= want[i] && soft[i] < most / 1024;
          }
          // A cut inside a run of equal probabilities: ties broken by id decide which tokens stay.
          float lowest_kept = 2.0f, highest_dropped = -1.0f;
          for (int32_t i = 0; i < n; ++i) {
            if (want[i]) lowest_kept = std::min(lowest_kept, soft[i]);
            if (!want[i]) highest_dropped = std::max(highest_dropped, soft[i]);
          }
          cut_in_ties += lowest_kept == highest_dropped;
          kept_far_down += far_down;
          ++rows;
        }
      }
    }
  }
  // The rows exercised what they are meant to.
  EXPECT_GT(cut_in_ties, 20) << "of " << rows;
  EXPECT_GT(kept_far_down, 20) << "of " << rows;
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
