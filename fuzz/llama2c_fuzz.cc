// llama2.c checkpoints (model/weights.cc LoadLlama2c): the 28-byte header of 7 int32 and the
// size of the tensors it implies. The input is the whole file; a well-formed one is mapped and its
// tensor views are read end to end (ASan catches a view that points past the mapping).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "model/weights.h"

namespace {

// Reads the first and last float of `n` starting at `p`.
float Touch(const float* p, int64_t n) { return n > 0 ? p[0] + p[n - 1] : 0.0f; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = specula::fuzz::WriteScratch("model.bin", data, size);
  auto w = specula::LoadLlama2c(path);
  if (!w.ok()) return 0;
  const specula::ModelConfig& c = (*w)->config;
  volatile float sink = 0.0f;
  const int64_t d = c.dim, kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  sink = sink + Touch((*w)->embed.f32(), v * d) + Touch((*w)->final_norm, d) + Touch((*w)->lm_head.f32(), v * d);
  for (const specula::LayerWeights& l : (*w)->layers) {
    sink = sink + Touch(l.attn_norm, d) + Touch(l.wq.f32(), d * d) + Touch(l.wk.f32(), kv * d) +
           Touch(l.wv.f32(), kv * d) + Touch(l.wo.f32(), d * d) + Touch(l.ffn_norm, d) +
           Touch(l.w_gate.f32(), h * d) + Touch(l.w_up.f32(), h * d) + Touch(l.w_down.f32(), d * h);
  }
  (void)c.NumParams();
  return 0;
}
