// The CPU backend's Sample and VerifyDrafts (the references the CUDA kernels are tested against)
// agree with the engine's sampler and with the verifier's RejectionSample.
#include <random>
#include <vector>

#include "core/categorical.h"
#include "model/sampler.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "verify/rejection_sampler.h"

namespace specula {
namespace {

TEST(CpuSampleTest, MatchesSamplingProbabilities) {
  auto be = MakeCpuBackend();
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0, 3);
  std::uniform_real_distribution<float> uni(0, 1);
  struct Row {
    float t;
    int32_t k;
    float p;
  };
  const Row rows[] = {{0, 0, 1}, {1, 0, 1}, {0.7f, 5, 1}, {1, 0, 0.9f}, {1.3f, 50, 0.8f}, {1, 1, 1}, {2, 3, 0.95f}};
  for (int32_t vocab : {2, 97, 5000}) {
    const int32_t m = 40;
    std::vector<float> logits(m * vocab), temp(m), top_p(m), u(m), probs(m * vocab);
    std::vector<int32_t> top_k(m), tokens(m);
    for (float& l : logits) l = normal(rng);
    for (int32_t r = 0; r < m; ++r) {
      temp[r] = rows[r % 7].t;
      top_k[r] = rows[r % 7].k;
      top_p[r] = rows[r % 7].p;
      u[r] = uni(rng);
    }
    be->Sample(logits.data(), m, vocab, {temp.data(), top_k.data(), top_p.data(), u.data()}, probs.data(), tokens.data());
    std::vector<float> want;
    for (int32_t r = 0; r < m; ++r) {
      SamplingParams sp;
      sp.temperature = temp[r];
      sp.top_k = top_k[r];
      sp.top_p = top_p[r];
      const absl::Span<const float> row(logits.data() + r * vocab, vocab);
      SamplingProbabilities(sp, row, {}, &want);
      for (int32_t i = 0; i < vocab; ++i) ASSERT_NEAR(probs[r * vocab + i], want[i], 1e-6) << "vocab " << vocab << " row " << r << " token " << i;
      EXPECT_EQ(tokens[r], SampleCategorical(want, u[r])) << "vocab " << vocab << " row " << r;
      if (sp.temperature == 0 || sp.top_k == 1) {
        EXPECT_EQ(tokens[r], std::max_element(row.begin(), row.end()) - row.begin());
      }
    }
  }
}

// Replays a fixed list of draws.
class ListUniform : public Uniform {
 public:
  explicit ListUniform(std::vector<double> v) : Uniform(0), v_(std::move(v)) {}
  double Next() override { return v_.at(i_++); }

 private:
  std::vector<double> v_;
  size_t i_ = 0;
};

TEST(CpuVerifyTest, MatchesRejectionSample) {
  auto be = MakeCpuBackend();
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> uni(0, 1);
  const int32_t S = 200, k = 4, V = 12;
  std::vector<float> p(S * (k + 1) * V), q(S * k * V), ua(S * k), uf(S);
  std::vector<int32_t> nd(S), draft(S * k), acc(S), tok(S * (k + 1));
  auto dist = [&](float* row) {
    double sum = 0;
    for (int32_t v = 0; v < V; ++v) sum += row[v] = std::exp(3 * uni(rng));
    for (int32_t v = 0; v < V; ++v) row[v] = static_cast<float>(row[v] / sum);
  };
  for (int64_t r = 0; r < S * (k + 1); ++r) dist(p.data() + r * V);
  for (int64_t r = 0; r < S * k; ++r) dist(q.data() + r * V);
  for (int32_t s = 0; s < S; ++s) {
    nd[s] = s % (k + 1);
    for (int32_t i = 0; i < k; ++i) {
      draft[s * k + i] = SampleCategorical(absl::MakeConstSpan(q.data() + (s * k + i) * V, V), uni(rng));
      ua[s * k + i] = uni(rng);
    }
    uf[s] = uni(rng);
  }
  for (bool one_hot : {false, true}) {
    be->VerifyDrafts({S, k, V, nd.data(), draft.data(), p.data(), one_hot ? nullptr : q.data(), ua.data(), uf.data(),
                      acc.data(), tok.data()});
    int rejected = 0, bonus = 0;
    for (int32_t s = 0; s < S; ++s) {
      const absl::Span<const TokenId> d(draft.data() + s * k, nd[s]);
      const absl::Span<const float> tp(p.data() + s * (k + 1) * V, (nd[s] + 1) * V);
      const absl::Span<const float> dp = one_hot ? absl::Span<const float>() : absl::MakeConstSpan(q.data() + s * k * V, nd[s] * V);
      // RejectionSample draws accept uniforms until the first rejection, then one final draw:
      // find the rejection point first, then replay the same draws in its order.
      std::vector<double> draws(ua.begin() + s * k, ua.begin() + s * k + nd[s]);
      draws.push_back(uf[s]);
      ListUniform probe(draws);
      const int32_t accepted = RejectionSample(d, tp, dp, V, probe).num_accepted;
      std::vector<double> ordered(ua.begin() + s * k, ua.begin() + s * k + std::min(nd[s], accepted + 1));
      ordered.push_back(uf[s]);
      ListUniform replay(ordered);
      const VerifyResult want = RejectionSample(d, tp, dp, V, replay);
      ASSERT_EQ(acc[s], want.num_accepted) << "sequence " << s;
      for (int32_t i = 0; i <= want.num_accepted; ++i) EXPECT_EQ(tok[s * (k + 1) + i], want.tokens[i]) << "sequence " << s;
      rejected += !want.bonus;
      bonus += want.bonus;
    }
    EXPECT_GT(rejected, 0);  // both paths exercised
    EXPECT_GT(bonus, 0);
  }
}

}  // namespace
}  // namespace specula
