// The rejection sampler's accept, recover and bonus cases against hand-computed distributions.
#include "verify/rejection_sampler.h"

#include <map>

#include "core/categorical.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

class FixedUniform : public Uniform {
 public:
  explicit FixedUniform(std::vector<double> v) : Uniform(0), v_(std::move(v)) {}
  double Next() override { return v_.at(i_++); }

 private:
  std::vector<double> v_;
  size_t i_ = 0;
};

// vocab 3. Target rows p0 (after the prompt), p1 (after draft 0), p2 (bonus row).
const std::vector<float> kTarget = {0.5f, 0.3f, 0.2f,  //
                                    0.1f, 0.1f, 0.8f,  //
                                    0.6f, 0.2f, 0.2f};
const std::vector<float> kDraft = {0.2f, 0.6f, 0.2f,  //
                                   0.1f, 0.1f, 0.8f};

TEST(RejectionSamplerTest, AcceptRecoverBonusCases) {
  struct Case {
    const char* name;
    std::vector<TokenId> draft;
    std::vector<double> uniforms;
    std::vector<TokenId> want;
    int32_t want_accepted;
    bool want_bonus;
  };
  const std::vector<Case> cases = {
      // Draft 1: accept probability min(1, 0.3 / 0.6) = 0.5.
      {"accepted (u=0.49 < 0.5), then accepted (p=q), bonus from p2 (u=0.7 -> token 1)", {1, 2}, {0.49, 0.1, 0.7}, {1, 2, 1}, 2, true},
      // Rejected: recovered ~ norm(max(0, p0 - q0)) = norm([0.3, 0, 0]) = token 0 whatever u.
      {"rejected (u=0.51), recovered from the residual", {1, 2}, {0.51, 0.99}, {0}, 0, false},
      // Draft 0: min(1, 0.5 / 0.2) = 1: always accepted.
      {"p > q is always accepted", {0}, {0.999, 0.5}, {0, 2}, 1, true},
  };
  for (const Case& c : cases) {
    FixedUniform u(c.uniforms);
    const VerifyResult r = RejectionSample(c.draft, kTarget, absl::MakeConstSpan(kDraft).subspan(0, 3 * c.draft.size()), 3, u);
    EXPECT_EQ(r.tokens, c.want) << c.name;
    EXPECT_EQ(r.num_accepted, c.want_accepted) << c.name;
    EXPECT_EQ(r.bonus, c.want_bonus) << c.name;
  }
}

TEST(RejectionSamplerTest, OneHotDraftsAcceptWithTargetProbabilityAndRecoverTheRest) {
  // n-gram drafts (no q): accept with p(x); recovered ~ p with x removed.
  std::map<TokenId, int> first;
  Uniform u(5);
  const int n = 200000;
  for (int i = 0; i < n; ++i) first[RejectionSample({1}, kTarget, {}, 3, u).tokens[0]]++;
  // P(token 1) = p0[1] = 0.3 (accepted); tokens 0 and 2 share the rest as 0.5 : 0.2.
  EXPECT_NEAR(first[1] / double(n), 0.3, 0.005);
  EXPECT_NEAR(first[0] / double(n), 0.5, 0.005);
  EXPECT_NEAR(first[2] / double(n), 0.2, 0.005);
}

TEST(RejectionSamplerTest, OutputFollowsTargetNotDraft) {
  // Draft tokens sampled from q; the first output token must follow p0 exactly.
  std::map<TokenId, int> counts;
  Uniform u(9);
  std::mt19937_64 rng(3);
  const int n = 300000;
  for (int i = 0; i < n; ++i) {
    const TokenId d = SampleCategorical(absl::MakeConstSpan(kDraft).subspan(0, 3), std::uniform_real_distribution<double>(0, 1)(rng));
    counts[RejectionSample({d}, kTarget, absl::MakeConstSpan(kDraft).subspan(0, 3), 3, u).tokens[0]]++;
  }
  for (TokenId t = 0; t < 3; ++t) EXPECT_NEAR(counts[t] / double(n), kTarget[t], 0.004) << t;
}

TEST(GreedyVerifyTest, AcceptsWhileEqualThenTargetToken) {
  EXPECT_EQ(GreedyVerify({5, 6, 7}, {5, 6, 9, 1}).tokens, (std::vector<TokenId>{5, 6, 9}));
  EXPECT_EQ(GreedyVerify({5, 6, 7}, {5, 6, 9, 1}).num_accepted, 2);
  const VerifyResult all = GreedyVerify({5, 6}, {5, 6, 4});
  EXPECT_EQ(all.tokens, (std::vector<TokenId>{5, 6, 4}));
  EXPECT_TRUE(all.bonus);
  EXPECT_EQ(GreedyVerify({3}, {8, 1}).tokens, std::vector<TokenId>{8});
}

TEST(SpecStatsTest, AcceptancePerPositionAndMeanLength) {
  SpecStats s;
  s.Record(4, 2);
  s.Record(4, 4);
  s.Record(2, 0);
  EXPECT_EQ(s.drafts, 3);
  EXPECT_EQ(s.draft_tokens, 10);
  EXPECT_EQ(s.accepted_tokens, 6);
  EXPECT_EQ(s.accepted_per_position, (std::vector<int64_t>{2, 2, 1, 1}));
  // Draft 2 was verified after two accepted ones twice (the first verification rejected it), draft
  // 3 once; the last verification reached only its first.
  EXPECT_EQ(s.reached_per_position, (std::vector<int64_t>{3, 2, 2, 1}));
  SpecStats m;
  m.Record(1, 1);
  m.Merge(s);
  EXPECT_EQ(m.reached_per_position, (std::vector<int64_t>{4, 2, 2, 1}));
  EXPECT_EQ(m.accepted_per_position, (std::vector<int64_t>{3, 2, 1, 1}));
  EXPECT_DOUBLE_EQ(s.mean_acceptance_length(), 3.0);
  EXPECT_DOUBLE_EQ(s.acceptance_rate(), 0.6);
}

TEST(SpecStatsTest, AcceptanceHistogramCountsVerificationsByDraftsAccepted) {
  SpecStats s;
  s.Record(0, 0);  // a step without drafts is no verification
  EXPECT_TRUE(s.acceptance_histogram.empty());
  s.Record(2, 0);
  s.Record(2, 2);
  s.Record(2, 0);
  EXPECT_EQ(s.acceptance_histogram, (std::vector<int64_t>{2, 0, 1}));
  s.Record(4, 3);  // a longer draft widens it; the shorter ones' entries stay
  EXPECT_EQ(s.acceptance_histogram, (std::vector<int64_t>{2, 0, 1, 1, 0}));
  int64_t steps = 0, accepted = 0;
  for (size_t j = 0; j < s.acceptance_histogram.size(); ++j) {
    steps += s.acceptance_histogram[j];
    accepted += static_cast<int64_t>(j) * s.acceptance_histogram[j];
  }
  EXPECT_EQ(steps, s.drafts);
  EXPECT_EQ(accepted, s.accepted_tokens);

  SpecStats m;
  m.Record(1, 1);
  m.Merge(s);  // the wider one merged into the narrower
  EXPECT_EQ(m.acceptance_histogram, (std::vector<int64_t>{2, 1, 1, 1, 0}));
  SpecStats w = s;
  SpecStats narrow;
  narrow.Record(1, 0);
  w.Merge(narrow);  // and the narrower into the wider
  EXPECT_EQ(w.acceptance_histogram, (std::vector<int64_t>{3, 0, 1, 1, 0}));
  EXPECT_EQ(w.drafts, 5);
}

}  // namespace
}  // namespace specula
