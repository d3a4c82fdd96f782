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
  // llama.cpp does, instead of two (kernels/cpu/quant_gemm.h): faster prefill, less accurate.
  bool int8_activations = false;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options = {});

}  // namespace specula
