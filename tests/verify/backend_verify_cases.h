// Checks of BackendVerifier (verify/backend_verify.h) against the host's Verify, written once for
// any backend: the CPU suite runs them on the CPU backend, the GPU suite on the device.
#pragma once

#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "verify/backend_verify.h"

namespace specula::testing {

// Logits [rows, vocab] in a backend's memory, uploaded from the host copy.
struct BackendRows {
  BackendRows(Backend& be, std::vector<float> host) : host(std::move(host)) {
    EXPECT_TRUE(dev.Grow(&be, this->host.size() * sizeof(float)).ok());
    be.CopyIn(dev.get(), this->host.data(), this->host.size() * sizeof(float));
    EXPECT_TRUE(be.Sync().ok());
  }
  std::vector<float> host;
  BackendBuffer dev;
};

// One sequence of a mixed step: its sampling, its drafts (some equal to the row's argmax, so that
// greedy verification accepts a prefix), and streams seeded alike for both verifiers.
struct CaseSeq {
  SamplingParams params;
  std::vector<TokenId> drafts;
  std::vector<TokenId> history;
  int32_t first_row = 0;
};

inline TokenId RowArgmax(const std::vector<float>& logits, int32_t vocab, int32_t row) {
  const float* r = logits.data() + static_cast<size_t>(row) * vocab;
  return static_cast<TokenId>(std::max_element(r, r + vocab) - r);
}

// Greedy sequences (plain, with drafts, synthetic or not) and ones the backend cannot sample
// (repetition penalty, min-p: routed to the host) give exactly the host's tokens, acceptance counts
// and draws.
inline void ExpectGreedyMatchesHost(Backend& be, int32_t vocab, double synthetic_alpha) {
  std::mt19937_64 rng(vocab + 7);
  std::vector<CaseSeq> seqs;
  int32_t rows = 0;
  std::vector<float> logits;
  for (int32_t i = 0; i < 12; ++i) {
    CaseSeq s;
    if (i % 4 == 3) s.params.repetition_penalty = 1.3f;
    if (i % 6 == 5) {
      s.params.temperature = 0.8f;
      s.params.min_p = 0.05f;
    }
    const int32_t k = i % 3 == 0 ? 0 : 1 + i % 5;
    s.first_row = rows;
    for (int32_t r = 0; r <= k; ++r) {
      std::normal_distribution<float> n(0.0f, 3.0f);
      for (int32_t v = 0; v < vocab; ++v) logits.push_back(n(rng));
    }
    for (int32_t t = 0; t < 5; ++t) s.history.push_back(static_cast<TokenId>(rng() % vocab));
    const int32_t agree = static_cast<int32_t>(rng() % (k + 1));  // drafts that match the argmax
    for (int32_t d = 0; d < k; ++d) {
      const TokenId top = RowArgmax(logits, vocab, rows + d);
      s.drafts.push_back(d < agree ? top : (top + 1) % vocab);
    }
    rows += k + 1;
    seqs.push_back(s);
  }
  BackendRows dev(be, logits);
  std::vector<RowsToVerify> in;
  std::vector<std::unique_ptr<Sampler>> samplers;
  std::vector<std::unique_ptr<Uniform>> uniforms;
  for (size_t i = 0; i < seqs.size(); ++i) {
    samplers.push_back(std::make_unique<Sampler>(seqs[i].params));
    uniforms.push_back(std::make_unique<Uniform>(1000 + i));
    in.push_back({seqs[i].first_row, {seqs[i].drafts, {}}, &seqs[i].params, seqs[i].history, samplers.back().get(),
                  uniforms.back().get()});
  }
  BackendVerifier verifier(&be);
  std::vector<VerifyResult> got;
  ASSERT_TRUE(verifier.Run(dev.dev.as<float>(), rows, vocab, in, synthetic_alpha, &got).ok());
  ASSERT_EQ(got.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const CaseSeq& s = seqs[i];
    Sampler sampler(s.params);
    Uniform uniform(1000 + i);
    const auto rows_of = absl::MakeConstSpan(logits).subspan(static_cast<size_t>(s.first_row) * vocab,
                                                            (s.drafts.size() + 1) * static_cast<size_t>(vocab));
    VerifyResult want;
    if (s.drafts.empty()) {
      want.tokens = {sampler.Sample(rows_of, s.history)};
    } else {
      want = Verify(rows_of, vocab, {s.drafts, {}}, s.params, s.history, uniform, synthetic_alpha);
    }
    const std::string what = absl::StrCat("sequence ", i, " (k=", s.drafts.size(), ", temperature ",
                                          s.params.temperature, ", penalty ", s.params.repetition_penalty, ")");
    EXPECT_EQ(got[i].tokens, want.tokens) << what;
    EXPECT_EQ(got[i].num_accepted, want.num_accepted) << what;
    EXPECT_EQ(got[i].bonus, want.bonus) << what;
    // The streams advanced alike: the next draws agree.
    EXPECT_EQ(uniforms[i]->Next(), uniform.Next()) << what;
  }
}

// Chi-square statistic of the first token that sampled verification emits (the accepted draft or
// the recovered token) against the target's distribution p. Drafts are drawn from q; the verifier
// is told `told_q` (q itself, or a wrong distribution for the broken variant that a test must
// catch). With `plain`, rows carry no drafts and are sampled from p directly. `trials` sequences,
// one row pair each, in batches.
inline double FirstTokenChiSquare(Backend& be, int32_t vocab, int32_t trials, bool plain, bool wrong_q) {
  std::mt19937_64 rng(17);
  std::vector<float> row(vocab), q(vocab), told(vocab, 1.0f / vocab);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& x : row) x = n(rng);
  std::vector<float> p;  // [vocab] the target's distribution
  SamplingParams params;
  params.temperature = 1.0f;
  SamplingProbabilities(params, row, {}, &p);
  double qs = 0;
  for (int32_t v = 0; v < vocab; ++v) qs += q[v] = static_cast<float>(std::exp(0.7 * n(rng)) * (v % 3 == 0 ? 2.0 : 0.5));
  for (float& x : q) x = static_cast<float>(x / qs);
  if (!wrong_q) told = q;
  // Every third sequence of a verification batch samples one row plainly (not counted) from other
  // logits, so that the verified sequences' rows are not at the dense offsets, and reading a wrong
  // row shows.
  const int32_t batch = 2048;
  auto filler = [&](int32_t s) { return !plain && s % 3 == 2; };
  int32_t rows = 0;
  for (int32_t s = 0; s < batch; ++s) rows += plain || filler(s) ? 1 : 2;
  const std::vector<float> other(row.rbegin(), row.rend());
  std::vector<float> logits;  // [rows, vocab]
  for (int32_t s = 0; s < batch; ++s) {
    const std::vector<float>& r = filler(s) ? other : row;
    for (int32_t i = 0; i < (plain || filler(s) ? 1 : 2); ++i) logits.insert(logits.end(), r.begin(), r.end());
  }
  BackendRows dev(be, logits);
  std::vector<double> counts(vocab, 0.0);
  BackendVerifier verifier(&be);
  std::discrete_distribution<TokenId> draw_q(q.begin(), q.end());
  for (int32_t done = 0; done < trials;) {
    std::vector<std::vector<TokenId>> drafts(batch);
    std::vector<std::unique_ptr<Sampler>> samplers;
    std::vector<std::unique_ptr<Uniform>> uniforms;
    std::vector<RowsToVerify> in;
    for (int32_t s = 0, r = 0; s < batch; ++s) {
      params.seed = done + s;
      samplers.push_back(std::make_unique<Sampler>(params));
      uniforms.push_back(std::make_unique<Uniform>(7919 * (done + s) + 1));
      const bool one_row = plain || filler(s);
      if (!one_row) drafts[s] = {draw_q(rng)};
      in.push_back({r, {drafts[s], one_row ? absl::Span<const float>() : absl::MakeConstSpan(told)}, &params, {},
                    samplers.back().get(), uniforms.back().get()});
      r += one_row ? 1 : 2;
    }
    std::vector<VerifyResult> got;
    EXPECT_TRUE(verifier.Run(dev.dev.as<float>(), rows, vocab, in, -1, &got).ok());
    for (int32_t s = 0; s < batch && done < trials; ++s) {
      if (filler(s)) continue;
      counts[got.at(s).tokens.at(0)] += 1;
      ++done;
    }
  }
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0;
  for (int32_t v = 0; v < vocab; ++v) {
    const double expected = total * p[v];
    chi2 += (counts[v] - expected) * (counts[v] - expected) / expected;
  }
  return chi2;
}

// The chi-square quantile at 1 - 0.001 for 15 degrees of freedom (vocab 16).
constexpr double kChiSquare15At001 = 37.697;

}  // namespace specula::testing
