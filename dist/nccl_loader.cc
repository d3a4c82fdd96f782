// MakeNcclCommunicator: opens libspecula_nccl.so (dist/nccl_communicator.cc) beside the binary.
#include <dlfcn.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "core/beside_executable.h"
#include "dist/communicator.h"

namespace specula {
namespace {

struct NcclModule {
  void (*make)(Communicator*, int, double, void*, absl::StatusOr<std::unique_ptr<Communicator>>*) = nullptr;
  int (*device_count)() = nullptr;
  std::string error;
};

const NcclModule& Module() {
  static const NcclModule m = [] {
    NcclModule m;
#ifndef SPECULA_NCCL_MODULE
    m.error = "this build has no NCCL communicator (configure where nvcc and NCCL are installed)";
#else
    std::string path = SPECULA_NCCL_MODULE;
    if (const std::string beside = BesideExecutable("libspecula_nccl.so");
        !beside.empty() && ::access(beside.c_str(), F_OK) == 0) {
      path = beside;
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = ::dlerror();
      m.error = absl::StrCat("cannot load ", path, ": ", why != nullptr ? why : "dlopen failed");
      return m;
    }
    m.make = reinterpret_cast<decltype(m.make)>(::dlsym(h, "specula_nccl_make_communicator"));
    m.device_count = reinterpret_cast<decltype(m.device_count)>(::dlsym(h, "specula_nccl_device_count"));
    if (m.make == nullptr || m.device_count == nullptr) m.error = absl::StrCat(path, ": not a Specula NCCL module");
#endif
    return m;
  }();
  return m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device,
                                                                   void* cuda_stream) {
  const NcclModule& m = Module();
  if (!m.error.empty()) return absl::UnavailableError(m.error);
  absl::StatusOr<std::unique_ptr<Communicator>> out = absl::UnknownError("not made");
  m.make(bootstrap, device, bootstrap->timeout_s(), cuda_stream, &out);
  return out;
}

int NcclDeviceCount() {
  const NcclModule& m = Module();
  return m.error.empty() ? m.device_count() : 0;
}

}  // namespace specula
