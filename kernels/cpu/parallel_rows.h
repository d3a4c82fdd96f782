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

// The row tiles of several matrices in one parallel loop (one fork and join for Q, K and V, or
// gate and up): f(o, r0) for each tile of `tile_rows` rows from r0 of matrix o < count (at most 8;
// rows(o) rows each), each tile on one thread; in parallel when all the rows times `work_per_row`
// reach 2^16.
template <typename Rows, typename F>
void ForEachRowTile(int32_t count, Rows&& rows, int32_t tile_rows, int64_t work_per_row, F&& f) {
  int32_t first[8 + 1] = {0};  // matrix o's tiles: [first[o], first[o + 1])
  int64_t total = 0;
  for (int32_t o = 0; o < count; ++o) {
    const int64_t n = rows(o);
    first[o + 1] = first[o] + static_cast<int32_t>((n + tile_rows - 1) / tile_rows);
    total += n;
  }
#pragma omp parallel for schedule(static) if (total * work_per_row >= (1 << 16))
  for (int32_t t = 0; t < first[count]; ++t) {
    int32_t o = 0;
    while (t >= first[o + 1]) ++o;
    f(o, (t - first[o]) * tile_rows);
  }
}

// The size of passes of equal size over m rows, at most max_rows each (18 rows as 9 + 9, not
// 16 + 2); the last pass takes the rest.
inline int32_t EqualPassSize(int32_t m, int32_t max_rows) {
  const int32_t passes = (m + max_rows - 1) / max_rows;
  return (m + passes - 1) / passes;
}

}  // namespace specula::cpu
