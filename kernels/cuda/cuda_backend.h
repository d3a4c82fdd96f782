// The CUDA backend: every Backend op on one NVIDIA GPU, in bf16, f16 or f32 with float32
// accumulation; matrix products through cuBLAS. This header carries no CUDA types, so the engine
// and tools include it freely; the kernels live behind it in kernels/cuda/.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace specula {

struct CudaBackendOptions {
  int device = 0;
  DType dtype = DType::kBF16;  // weights, activations and KV
};

// Number of usable CUDA devices; 0 when there is no GPU or no driver (never an error).
int CudaDeviceCount();

// Device-to-device copy bandwidth in GB/s (bytes read + written per second), the memory floor
// of a decode step: weight bytes / this bandwidth.
absl::StatusOr<double> MeasureCopyBandwidthGBs(int device, size_t bytes);

// FailedPrecondition when no device is present, naming the CUDA error.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options);

}  // namespace specula
