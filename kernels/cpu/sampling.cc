#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "absl/types/span.h"
#include "core/categorical.h"

namespace specula::cpu {
namespace {

// The processed distribution of one row (see SampleArgs for the rules), into p[vocab].
void ProcessRow(const float* logits, int32_t vocab, float temperature, int32_t top_k, float top_p,
                float* p) {
  const int32_t argmax = Argmax(absl::MakeConstSpan(logits, vocab));
  if (!(temperature > 0.0f)) {
    std::fill(p, p + vocab, 0.0f);
    p[argmax] = 1.0f;
    return;
  }
  float cutoff = -INFINITY;  // logits below are dropped (top-k)
  if (top_k > 0 && top_k < vocab) {
    std::vector<float> sorted(logits, logits + vocab);  // [vocab]
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
    cutoff = sorted[top_k - 1];
  }
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    p[i] = logits[i] >= cutoff ? std::exp((logits[i] - logits[argmax]) / temperature) : 0.0f;
    sum += p[i];
  }
  if (top_p < 1.0f) {
    std::vector<float> sorted(p, p + vocab);  // [vocab] descending
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    double mass = 0.0;
    float keep_from = sorted[0];
    for (float v : sorted) {
      mass += v;
      keep_from = v;
      if (mass >= top_p * sum) break;
    }
    sum = 0.0;
    for (int32_t i = 0; i < vocab; ++i) {
      if (p[i] < keep_from) p[i] = 0.0f;
      sum += p[i];
    }
  }
  for (int32_t i = 0; i < vocab; ++i) p[i] = static_cast<float>(p[i] / sum);
}

}  // namespace

void SampleRows(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args,
                float* probs, int32_t* tokens) {
  std::vector<float> row(vocab);  // [vocab]
  for (int32_t r = 0; r < m; ++r) {
    const int64_t at = args.probs_row != nullptr ? args.probs_row[r] : r;
    float* p = probs != nullptr ? probs + at * vocab : row.data();
    ProcessRow(logits + static_cast<int64_t>(r) * vocab, vocab, args.temperature[r], args.top_k[r],
               args.top_p[r], p);
    tokens[r] = SampleCategorical(absl::MakeConstSpan(p, vocab), args.uniform[r]);
  }
}

void ArgmaxRows(const float* logits, int32_t m, int32_t vocab, int32_t* tokens) {
  for (int32_t r = 0; r < m; ++r) tokens[r] = Argmax(absl::MakeConstSpan(logits + static_cast<int64_t>(r) * vocab, vocab));
}

void VerifyRows(const VerifyArgs& a) {
  const int64_t V = a.vocab;
  std::vector<float> residual(V);  // [vocab] max(0, p - q)
  for (int32_t s = 0; s < a.num_seqs; ++s) {
    const int32_t n = a.num_drafts[s];
    const int32_t* draft = a.draft + static_cast<int64_t>(s) * a.k;
    const int64_t t_row = a.target_row != nullptr ? a.target_row[s] : static_cast<int64_t>(s) * (a.k + 1);
    const int64_t d_row = a.draft_row != nullptr ? a.draft_row[s] : static_cast<int64_t>(s) * a.k;
    const float* target = a.target_probs + t_row * V;
    const float* q_rows = a.draft_probs ? a.draft_probs + d_row * V : nullptr;
    int32_t* out = a.tokens + static_cast<int64_t>(s) * (a.k + 1);
    const double u_final = a.uniform_final[s];
    int32_t i = 0;
    for (; i < n; ++i) {
      const float* p = target + i * V;
      const int32_t x = draft[i];
      const float q_x = q_rows ? q_rows[i * V + x] : 1.0f;
      const double accept = q_x > 0.0f ? std::min(1.0, static_cast<double>(p[x]) / q_x) : 0.0;
      if (a.uniform_accept[static_cast<int64_t>(s) * a.k + i] < accept) {
        out[i] = x;  // accepted
        continue;
      }
      double mass = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        const float q_v = q_rows ? q_rows[i * V + v] : (v == x ? 1.0f : 0.0f);
        residual[v] = std::max(0.0f, p[v] - q_v);
        mass += residual[v];
      }
      out[i] = mass > 0.0 ? SampleCategorical(residual, u_final)  // recovered
                          : SampleCategorical(absl::MakeConstSpan(p, V), u_final);
      break;
    }
    a.num_accepted[s] = i;
    if (i == n) out[n] = SampleCategorical(absl::MakeConstSpan(target + n * V, V), u_final);  // bonus
  }
}

}  // namespace specula::cpu
