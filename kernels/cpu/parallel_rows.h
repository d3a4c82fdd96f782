// Element-wise work over both cores. A batched step's norms, RoPE, SwiGLU, embedding rows and KV
// writes ran on one core while the other waited at the next barrier: 1.6 s (6%) of a 25 s
// 32-sequence batching run. A fork/join costs a few microseconds, so only work of at least
// kParallelElements elements is split (a decode step of one sequence stays on one core).
#pragma once

#include <cstdint>

namespace specula::cpu {

inline constexpr int64_t kParallelElements = int64_t{1} << 13;

// f(i) for i in [0, n), each index on one thread, so results are the same bits on any number of
// threads; in parallel when n * elements_per_index >= kParallelElements.
template <typename F>
void ParallelFor(int64_t n, int64_t elements_per_index, F&& f) {
#pragma omp parallel for schedule(static) if (n > 1 && n * elements_per_index >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace specula::cpu
