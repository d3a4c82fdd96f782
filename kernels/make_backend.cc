#include "kernels/make_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "core/beside_executable.h"
#include "kernels/cpu/cpu_backend.h"

namespace specula {
namespace {

// The CUDA module's entry points (kernels/cuda/module.cc), or why it could not be loaded.
struct CudaModule {
  int (*device_count)() = nullptr;
  void (*make_backend)(int, int, absl::StatusOr<std::unique_ptr<Backend>>*) = nullptr;
  void (*copy_bandwidth)(int, size_t, absl::StatusOr<double>*) = nullptr;
  std::string error;
};

#ifdef SPECULA_HAVE_CUDA
// Where the module may be: next to the running binary (an installed tree), where this build put it
// (test and benchmark binaries live in other folders), then the library search path.
std::vector<std::string> ModulePaths() {
  std::vector<std::string> paths;
  if (std::string beside = BesideExecutable("libspecula_cuda.so"); !beside.empty()) paths.push_back(beside);
#ifdef SPECULA_CUDA_MODULE
  paths.push_back(SPECULA_CUDA_MODULE);
#endif
  paths.push_back("libspecula_cuda.so");
  return paths;
}
#endif

CudaModule LoadCuda() {
  CudaModule m;
#ifndef SPECULA_HAVE_CUDA
  m.error = "this build has no CUDA backend (configure with -DSPECULA_CUDA=ON where nvcc is installed)";
#else
  std::string tried;
  for (const std::string& path : ModulePaths()) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      // A module that exists but cannot load (a missing CUDA runtime) is the error to report.
      if (::access(path.c_str(), F_OK) == 0 || tried.empty()) tried = why != nullptr ? why : path;
      continue;
    }
    m.device_count = reinterpret_cast<decltype(m.device_count)>(::dlsym(handle, "specula_cuda_device_count"));
    m.make_backend = reinterpret_cast<decltype(m.make_backend)>(::dlsym(handle, "specula_cuda_make_backend"));
    m.copy_bandwidth = reinterpret_cast<decltype(m.copy_bandwidth)>(::dlsym(handle, "specula_cuda_copy_bandwidth"));
    if (m.device_count != nullptr && m.make_backend != nullptr && m.copy_bandwidth != nullptr) return m;
    m = CudaModule{};
    tried = absl::StrCat(path, ": not a Specula CUDA module");
  }
  m.error = absl::StrCat("cannot load the CUDA backend (libspecula_cuda.so): ", tried);
#endif
  return m;
}

const CudaModule& Cuda() {
  static const CudaModule* module = new CudaModule(LoadCuda());  // loaded once, on first use
  return *module;
}

}  // namespace

bool CudaBuilt() {
#ifdef SPECULA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDevices() { return Cuda().device_count != nullptr ? Cuda().device_count() : 0; }

absl::StatusOr<double> CudaCopyBandwidthGBs(int device, size_t bytes) {
  if (Cuda().copy_bandwidth == nullptr) return absl::FailedPreconditionError(Cuda().error);
  absl::StatusOr<double> out = absl::UnknownError("");
  Cuda().copy_bandwidth(device, bytes, &out);
  return out;
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
    return MakeCpuBackend({int8, spec.int8_activations});
  }
  if (spec.device == "cuda") {
    auto dtype = ParseDType(spec.dtype.empty() ? "bf16" : spec.dtype);
    if (!dtype.ok()) return dtype.status();
    if (Cuda().make_backend == nullptr) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", Cuda().error));
    absl::StatusOr<std::unique_ptr<Backend>> out = absl::UnknownError("");
    Cuda().make_backend(spec.device_index, static_cast<int>(*dtype), &out);
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat("--device: '", spec.device, "' is not cpu or cuda"));
}

}  // namespace specula
