#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>

namespace specula {

TokenLogprobs ScoreToken(absl::Span<const float> row, TokenId token, int32_t top) {
  const int32_t vocab = static_cast<int32_t>(row.size());
  float max = row[0];
  for (float v : row) max = std::max(max, v);
  double sum = 0;  // in double: 49,152 terms
  for (float v : row) sum += std::exp(static_cast<double>(v) - max);
  const double log_z = max + std::log(sum);
  auto logprob = [&](TokenId t) { return static_cast<float>(static_cast<double>(row[t]) - log_z); };
  TokenLogprobs out;
  out.token = token;
  out.logprob = logprob(token);
  // The `top` best in one pass: a min-heap of (logit, -id), its root the weakest kept.
  const int32_t k = std::min(top, vocab);
  if (k <= 0) return out;
  auto better = [&](TokenId a, TokenId b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
  std::vector<TokenId> heap;  // [<= k]
  heap.reserve(k);
  for (TokenId t = 0; t < vocab; ++t) {
    if (static_cast<int32_t>(heap.size()) < k) {
      heap.push_back(t);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(t, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = t;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  for (TokenId t : heap) out.top.emplace_back(t, logprob(t));
  return out;
}

}  // namespace specula
