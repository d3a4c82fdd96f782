// Reference implementations of the sampling ops (Backend::Sample and Backend::VerifyDrafts) on
// host memory. The CUDA kernels are tested against these.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace specula::cpu {

void SampleRows(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args,
                float* probs, int32_t* tokens);

void ArgmaxRows(const float* logits, int32_t m, int32_t vocab, int32_t* tokens);

void VerifyRows(const VerifyArgs& args);

}  // namespace specula::cpu
