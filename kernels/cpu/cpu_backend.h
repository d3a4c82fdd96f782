// The reference backend: plain loops, OpenBLAS for the matrix products.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace specula {

struct CpuOptions {
  // Weight matrices stored as int8 with one float scale per row (symmetric, max |w| / 127),
  // dequantized on the fly; activations and KV stay f32. A quarter of the bytes per decode step:
  // meant for draft models, whose weights' precision costs acceptance, never correctness.
  bool int8_weights = false;
  // GGUF quantized matrices multiply activations rounded to one 8-bit term per group of 32, as
  // llama.cpp does; false: two terms (kernels/cpu/quant_gemm.h), within ~1e-4 of float32 but twice
  // the integer work. One is the default: a 5-token verification step of SmolLM2 Q4_1 costs 2.3x a
  // 1-token step with two terms and 1.7x with one, and a 600-token prefill runs 2.1-2.5x as fast
  // (docs/benchmarks.md, "Multi-token steps").
  bool int8_activations = true;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options = {});

}  // namespace specula
