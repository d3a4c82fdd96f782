// The CPU backend's float32 GEMM on weights packed once at upload (AVX-512 or AVX2 + FMA): w[n, k] is
// stored as [ceil(n / 64)][k][64], so each thread reads its weights as one sequential stream (what
// the prefetcher follows best) and a register tile of up to 6 tokens x 64 rows (AVX2: 6 x 16, with
// half the registers) broadcasts the activations instead of reducing dot products horizontally.
// (Groups of 16 rows read a 1B model's weights 40% slower at one token; 16-row slices of a group
// are only the unit in which work is split between threads, so that a small matrix at one token
// still splits evenly.)
//
// Every product of a packed matrix goes through PackedGemm, whatever the number of tokens, and
// every output element is one chain of FMAs over k in order: a token's result is the same bits
// whatever batch it runs in (one token, a verification run, 32 sequences). Greedy speculative
// decoding relies on that, and so does a bf16 KV cache, where a rounding difference of 1e-7 in a
// key can land on the other side of a bf16 step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace specula::cpu {

// True where the packed kernel is compiled in (AVX-512, or AVX2 with FMA); elsewhere weights stay
// row-major.
bool PackedGemmAvailable();

// `bytes` rounded up to whole 2 MB pages, 2 MB aligned and advised for transparent huge pages; null
// when out of memory; std::free() releases it. Large buffers read in scattered pieces (the KV pool:
// a sequence's blocks lie anywhere in it) otherwise miss the TLB on most 4 KB pages they touch.
void* AllocHugePages(size_t bytes);

// Memory for packed matrices: chunks of 2 MB pages (where the kernel allows them), handed out in
// order and freed together. Packing a 60 MB model into 4 KB pages took most of its startup in page
// faults: each layer's matrices are smaller than a huge page on their own.
class PackedArena {
 public:
  PackedArena() = default;
  PackedArena(const PackedArena&) = delete;
  PackedArena& operator=(const PackedArena&) = delete;
  ~PackedArena();
  // 64-byte aligned; never null (aborts when out of memory, as operator new would).
  float* Alloc(size_t floats);

 private:
  std::vector<std::pair<char*, size_t>> chunks_;  // (base, bytes)
  size_t used_ = 0;                               // bytes of the last chunk handed out
};

class PackedMatrix {
 public:
  static constexpr int32_t kGroup = 64;  // rows per packed group
  static constexpr int32_t kSlice = 16;  // rows per vector: the unit of work splitting

  // w[rows, cols], row-major, packed into memory from `arena` (which must outlive the matrix).
  PackedMatrix(const float* w, int64_t rows, int64_t cols, PackedArena* arena);
  const float* data() const { return data_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // w[r, j] for j in [0, cols) into out[cols].
  void Row(int64_t r, float* out) const;

 private:
  const float* data_;  // [groups, cols, kGroup], rows past `rows` are zero
  int64_t rows_, cols_;
};

// One product of a PackedGemm call: y[m, w->rows()] = x[m, k] w^T + bias (bias may be null).
struct PackedOut {
  const PackedMatrix* w;
  const float* bias;
  float* y;
};

// Every output of the same x[m, k] (k the matrices' cols) in one parallel pass (Q/K/V, gate/up),
// the work (16-row slices x blocks of tokens) split evenly between the threads.
void PackedGemm(const float* x, int32_t m, const PackedOut* outs, int32_t num_outs);

}  // namespace specula::cpu
