#include "kernels/make_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef SPECULA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace specula {

bool CudaBuilt() {
#ifdef SPECULA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDevices() {
#ifdef SPECULA_HAVE_CUDA
  return CudaDeviceCount();
#else
  return 0;
#endif
}

absl::Status CheckQuantization(const std::string& flag, const std::string& quantization, const std::string& device) {
  if (!quantization.empty() && quantization != "none" && quantization != "int8") {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", quantization, "' is not none or int8"));
  }
  if (quantization == "int8" && device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat(flag, " int8 is a CPU backend format (--device ", device, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendSpec& spec) {
  if (auto st = CheckQuantization("quantization", spec.quantization, spec.device); !st.ok()) return st;
  const bool int8 = spec.quantization == "int8";
  if (spec.device == "cpu") {
    if (!spec.dtype.empty() && spec.dtype != "f32" && spec.dtype != "float32") {
      return absl::InvalidArgumentError(absl::StrCat("--dtype ", spec.dtype,
                                                     ": the CPU backend computes in f32 (bf16/f16 need --device cuda)"));
    }
    return MakeCpuBackend({int8});
  }
  if (spec.device == "cuda") {
    auto dtype = ParseDType(spec.dtype.empty() ? "bf16" : spec.dtype);
    if (!dtype.ok()) return dtype.status();
#ifdef SPECULA_HAVE_CUDA
    return MakeCudaBackend({spec.device_index, *dtype});
#else
    return absl::FailedPreconditionError(
        "--device cuda: this build has no CUDA backend (configure with -DSPECULA_CUDA=ON where nvcc is installed)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("--device: '", spec.device, "' is not cpu or cuda"));
}

}  // namespace specula
