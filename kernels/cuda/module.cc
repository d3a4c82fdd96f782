// The CUDA backend as a module (libspecula_cuda.so) that kernels/make_backend.cc loads with dlopen
// when a GPU is asked for: the specula binary itself never links CUDA, so a CPU run does not map
// cudart and cuBLAS (which alone took 90 ms and 220 MB of RSS at startup). C entry points; the
// module and the binary are built together, so the C++ types passed are the same.
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_backend.h"

extern "C" {

__attribute__((visibility("default"))) int specula_cuda_device_count() { return specula::CudaDeviceCount(); }

__attribute__((visibility("default"))) void specula_cuda_make_backend(
    int device, int dtype, absl::StatusOr<std::unique_ptr<specula::Backend>>* out) {
  *out = specula::MakeCudaBackend({device, static_cast<specula::DType>(dtype)});
}

__attribute__((visibility("default"))) void specula_cuda_copy_bandwidth(int device, size_t bytes,
                                                                        absl::StatusOr<double>* out) {
  *out = specula::MeasureCopyBandwidthGBs(device, bytes);
}

}  // extern "C"
