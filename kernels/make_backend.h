// Backend selection by name (--device cpu|cuda), for the tools, benchmarks and tests.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace specula {

struct BackendSpec {
  std::string device = "cpu";  // cpu | cuda
  std::string dtype;           // empty: f32 on cpu, bf16 on cuda
  int device_index = 0;
  std::string quantization = "none";  // or "int8": weight-only int8 matrices (cpu only)
  bool int8_activations = true;       // GGUF blocks times one 8-bit activation term, else two (cpu only)
};

// InvalidArgument for an unknown device, a dtype the device does not compute in, or a
// quantization it does not offer;
// FailedPrecondition when CUDA is asked for but not built in, or no GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendSpec& spec);

// InvalidArgument, naming `flag`, unless `quantization` is empty, none, or int8 on the cpu.
absl::Status CheckQuantization(const std::string& flag, const std::string& quantization, const std::string& device);

// True when this build has the CUDA backend (a module, libspecula_cuda.so, loaded on first use:
// CPU runs never map the CUDA libraries).
bool CudaBuilt();
// Usable CUDA devices (0 without a GPU, a driver, or the CUDA build).
int CudaDevices();
// Device-to-device copy bandwidth in GB/s (the memory floor of a decode step); FailedPrecondition
// without the CUDA backend.
absl::StatusOr<double> CudaCopyBandwidthGBs(int device, size_t bytes);

}  // namespace specula
