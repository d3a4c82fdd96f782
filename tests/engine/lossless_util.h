// What the lossless tests share: the sample counts (bounded by SPECULA_QUICK and under a
// sanitizer), --num-spec-tokens auto at fixed costs, the chi-square statistic and its p-value, and
// the target's exact joint distribution of the first tokens after a prompt, enumerated prefix by
// prefix (optionally under a mask, and with prefixes that end before the depth).
#pragma once

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/forward_cost.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/sampler.h"

namespace specula::testing {

// SPECULA_QUICK=1 (CI, .ci/run) bounds these tests: fewer prompts, k values and samples,
// the same assertions.
inline bool Quick() {
  const char* q = std::getenv("SPECULA_QUICK");
  return q != nullptr && q[0] == '1';
}

inline bool UnderSanitizer() {
  const char* san = std::getenv("SPECULA_SANITIZER");
  return san != nullptr && san[0] != '\0';
}

// Under a sanitizer (SPECULA_SANITIZER, from the asan test preset) the same paths run on 2000 samples:
// that run looks for memory errors, and the broken verifiers still come out at p < 1e-10 there.
inline int64_t Samples() {
  if (UnderSanitizer()) return 2000;
  return Quick() ? 8000 : 100000;  // 8000: p < 1e-10 for the broken verifiers
}

inline std::unique_ptr<LlamaModel> Load(const std::string& path, bool int8_weights = false) {
  auto w = LoadModel(path);
  EXPECT_TRUE(w.ok()) << w.status();
  return std::make_unique<LlamaModel>(std::move(w).value(), MakeCpuBackend({int8_weights}));
}

// --num-spec-tokens auto with fixed costs (no timing involved, so the run is reproducible): a
// memory-bound target (a step of 1 ms, 1 us per token, at any batch size here) and a draft forward
// of `draft_forward` seconds (0.4 ms: drafts pay when their acceptance is above ~0.4). The real
// pair's acceptances, drawn per step (Thompson sampling), then give k from 0 to the cap, changing
// per sequence and step.
inline SpecConfig AutoSpec(Proposer* proposer, const LlamaModel& target, const LlamaModel& draft,
                           double draft_forward = 4e-4) {
  auto table = [](const ModelConfig& c, double fixed, double per_token) {
    std::vector<CostPoint> t;
    for (int n = 1; n <= 512; n *= 2) t.push_back({ForwardFlops(c, n, n, n * 20.0), fixed + per_token * n});
    return t;
  };
  SpecConfig spec;
  spec.proposer = proposer;
  spec.adaptive = true;
  spec.target_cost = table(target.config(), 1e-3, 1e-6);
  spec.draft_cost = table(draft.config(), draft_forward, 1e-7);
  spec.refine_cost = false;
  return spec;
}

// Both drafting and not drafting happened.
inline void ExpectVariedK(const EngineStats& s, const char* name) {
  int64_t drafted = 0;
  for (size_t k = 1; k < s.spec_k_histogram.size(); ++k) drafted += s.spec_k_histogram[k];
  EXPECT_GT(s.spec_k_histogram[0], 0) << name;
  EXPECT_GT(drafted, 0) << name;
}

// Chi-square p-value (upper tail) by the Wilson-Hilferty approximation, good for dof >= 10.
inline double ChiSquarePValue(double x, int dof) {
  if (std::isinf(x)) return 0.0;
  const double k = dof;
  const double z = (std::cbrt(x / k) - (1.0 - 2.0 / (9.0 * k))) / std::sqrt(2.0 / (9.0 * k));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

using Joint = std::map<std::vector<TokenId>, double>;
using Counts = std::map<std::vector<TokenId>, int64_t>;

// Chi-square statistic of observed counts against expected probabilities, and its degrees of freedom.
// Cells with an expected count below 5 are pooled, and so are observed sequences the distribution
// does not hold (an impossible one makes the statistic infinite).
inline std::pair<double, int> ChiSquare(const Joint& probs, const Counts& counts, int64_t n) {
  double stat = 0.0, pooled_e = 0.0;
  int64_t pooled_o = 0;
  int cells = 0;
  for (const auto& [key, p] : probs) {
    const double e = p * n;
    auto it = counts.find(key);
    const int64_t o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  for (const auto& [key, o] : counts) pooled_o += probs.count(key) ? 0 : o;
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  } else if (pooled_o > 0) {
    stat = std::numeric_limits<double>::infinity();
  }
  return {stat, cells - 1};
}

struct Lossless {
  double p_value;
  int dof;
};

// The model's last logits after prompt + each prefix, in batched forwards (one sequence each).
// Returns [prefixes, vocab], or empty after a failed forward.
inline std::vector<float> LastLogits(LlamaModel& model, const std::vector<TokenId>& prompt,
                                     const std::vector<std::vector<TokenId>>& prefixes) {
  const size_t vocab = model.config().vocab_size;
  constexpr size_t kPerForward = 64;  // sequences per forward
  size_t longest = 0;
  for (const auto& p : prefixes) longest = std::max(longest, p.size());
  const int32_t blocks_per_seq = static_cast<int32_t>((prompt.size() + longest + 15) / 16);
  KvCache kv(model.config(), {16, static_cast<int32_t>(kPerForward) * blocks_per_seq});
  std::vector<float> out(prefixes.size() * vocab);  // [prefixes, vocab]
  for (size_t first = 0; first < prefixes.size(); first += kPerForward) {
    const size_t count = std::min(kPerForward, prefixes.size() - first);
    // The batch's spans point into these: seqs [count][prompt + prefix], tables [count][blocks_per_seq].
    std::vector<std::vector<TokenId>> seqs(count, prompt);
    std::vector<std::vector<BlockId>> tables(count);
    ForwardBatch batch;
    for (size_t i = 0; i < count; ++i) {
      seqs[i].insert(seqs[i].end(), prefixes[first + i].begin(), prefixes[first + i].end());
      for (int32_t b = 0; b < blocks_per_seq; ++b) tables[i].push_back(static_cast<BlockId>(i) * blocks_per_seq + b);
      batch.seqs.push_back({seqs[i], 0, tables[i]});
    }
    std::vector<float> logits;  // [count, vocab]
    const absl::Status st = model.Forward(batch, kv, LogitsMode::kLastPerSequence, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return {};
    std::copy(logits.begin(), logits.end(), out.begin() + first * vocab);
  }
  return out;
}

// What a constrained enumeration adds: `mask(prefix, logits)` before each row's probabilities, and
// prefixes that `ended` (a stop token) kept as they are at every later level.
struct JointHooks {
  std::function<void(const std::vector<TokenId>& prefix, absl::Span<float> logits)> mask;
  std::function<bool(const std::vector<TokenId>& prefix)> ended;
};

// The target's exact joint distribution of the first `depth` generated tokens after `prompt`:
// prefixes enumerated level by level (those below 1e-9 dropped), each level's in batched forwards.
inline Joint ExactJoint(LlamaModel& target, const std::vector<TokenId>& prompt, int depth, const SamplingParams& sp,
                        const JointHooks& hooks = {}) {
  const size_t vocab = target.config().vocab_size;
  Joint probs = {{{}, 1.0}};
  Sampler sampler(sp);
  for (int level = 0; level < depth; ++level) {
    Joint next;
    std::vector<std::vector<TokenId>> live;
    std::vector<double> live_p;
    for (const auto& [prefix, p] : probs) {
      if (hooks.ended && hooks.ended(prefix)) {
        next[prefix] = p;
      } else if (p >= 1e-9) {
        live.push_back(prefix);
        live_p.push_back(p);
      }
    }
    std::vector<float> logits = LastLogits(target, prompt, live), q;  // logits: [live, vocab]
    if (logits.empty() && !live.empty()) return {};
    for (size_t i = 0; i < live.size(); ++i) {
      const absl::Span<float> row = absl::MakeSpan(logits).subspan(i * vocab, vocab);
      if (hooks.mask) hooks.mask(live[i], row);
      std::vector<TokenId> history = prompt;
      history.insert(history.end(), live[i].begin(), live[i].end());
      sampler.Probabilities(row, history, &q);
      for (size_t t = 0; t < vocab; ++t) {
        if (q[t] <= 0) continue;
        auto key = live[i];
        key.push_back(static_cast<TokenId>(t));
        next[key] = live_p[i] * q[t];
      }
    }
    probs = std::move(next);
  }
  return probs;
}

}  // namespace specula::testing
