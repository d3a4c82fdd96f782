// The NCCL communicator: GPU tensors, one GPU per rank, the unique id broadcast over the MPI group
// (the bootstrap), which also carries the host-side step plans. Built as a module
// (libspecula_nccl.so) that dist/nccl_loader.cc opens only for --device cuda, so that CPU runs
// never map NCCL or cudart. NCCL and CUDA types stay in this file.
//
// Timeouts: the communicator is created non-blocking, and each collective is waited for by polling
// the stream and ncclCommGetAsyncError; past the timeout the communicator is aborted
// (ncclCommAbort), which is what unblocks the other ranks' kernels too.
//
// Not yet run on a GPU: no device was lent to the issue that built it (README).
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dist/communicator.h"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator* bootstrap, cudaStream_t stream, double timeout_s)
      : bootstrap_(bootstrap), stream_(stream), timeout_s_(timeout_s) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr) broken_.ok() ? ncclCommDestroy(comm_) : ncclCommAbort(comm_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  absl::Status Init(int device) {
    if (cudaSetDevice(device) != cudaSuccess) return absl::UnavailableError(absl::StrCat("cudaSetDevice(", device, ") failed"));
    ncclUniqueId id{};
    if (bootstrap_->rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) return absl::UnavailableError("ncclGetUniqueId failed");
    if (auto st = bootstrap_->Broadcast(&id, sizeof(id), 0, "nccl unique id"); !st.ok()) return st;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, bootstrap_->size(), id, bootstrap_->rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress) return Fail("init", "ncclCommInitRankConfig", ncclGetErrorString(r));
    if (auto st = WaitComm("init", "ncclCommInitRankConfig"); !st.ok()) return st;
    if (cudaMalloc(&scratch_, sizeof(float)) != cudaSuccess) return absl::ResourceExhaustedError("cudaMalloc(4) failed");
    return absl::OkStatus();
  }

  const char* name() const override { return "nccl"; }
  int32_t rank() const override { return bootstrap_->rank(); }
  int32_t size() const override { return bootstrap_->size(); }
  double timeout_s() const override { return timeout_s_; }

  absl::Status AllReduceSum(void* data, int64_t count, DType dtype, absl::string_view what) override {
    const ncclDataType_t t = dtype == DType::kF32 ? ncclFloat32 : dtype == DType::kF16 ? ncclFloat16 : ncclBfloat16;
    return Run("all_reduce", what, ncclAllReduce(data, data, count, t, ncclSum, comm_, stream_));
  }
  absl::Status AllGather(const void* send, size_t bytes, void* recv, absl::string_view what) override {
    return Run("all_gather", what, ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_));
  }
  absl::Status Broadcast(void* data, size_t bytes, int32_t root, absl::string_view what) override {
    return Run("broadcast", what, ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
  }
  absl::Status Barrier(absl::string_view what) override {
    return Run("barrier", what, ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
  }
  // Host bytes: over the bootstrap group.
  absl::Status BroadcastMessage(std::string* msg, absl::string_view what) override {
    return bootstrap_->BroadcastMessage(msg, what);
  }

 private:
  absl::Status Run(const char* op, absl::string_view what, ncclResult_t issued) {
    if (!broken_.ok()) return broken_;
    if (issued != ncclSuccess && issued != ncclInProgress) return Fail(op, what, ncclGetErrorString(issued));
    if (auto st = WaitComm(op, what); !st.ok()) return st;
    const Clock::time_point begin = Clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Fail(op, what, cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return Fail(op, what, ncclGetErrorString(async));
      const double waited = std::chrono::duration<double>(Clock::now() - begin).count();
      if (waited > timeout_s_) {
        return Fail(op, what, absl::StrFormat("timed out after %.1f s (--collective-timeout-s %g)", waited, timeout_s_));
      }
      sched_yield();
    }
  }

  // Waits while the (non-blocking) communicator reports an operation in progress.
  absl::Status WaitComm(const char* op, absl::string_view what) {
    const Clock::time_point begin = Clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Fail(op, what, ncclGetErrorString(state));
      if (std::chrono::duration<double>(Clock::now() - begin).count() > timeout_s_) {
        return Fail(op, what, "timed out: another rank never joined");
      }
      sched_yield();
    }
  }

  absl::Status Fail(const char* op, absl::string_view what, const std::string& why) {
    broken_ = absl::UnavailableError(absl::StrCat("rank ", rank(), " of ", size(), ": NCCL collective ", op, " '",
                                                  what, "' failed: ", why));
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    return broken_;
  }

  Communicator* bootstrap_;
  cudaStream_t stream_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;  // [1] f32 for the barrier
  absl::Status broken_;
};

}  // namespace
}  // namespace specula

extern "C" {

// `stream` is the rank's backend stream (a cudaStream_t), so that collectives are ordered with the
// forward's kernels; `bootstrap` outlives the communicator.
__attribute__((visibility("default"))) void specula_nccl_make_communicator(
    specula::Communicator* bootstrap, int device, double timeout_s, void* stream,
    absl::StatusOr<std::unique_ptr<specula::Communicator>>* out) {
  auto c = std::make_unique<specula::NcclCommunicator>(bootstrap, static_cast<cudaStream_t>(stream), timeout_s);
  if (auto st = c->Init(device); !st.ok()) {
    *out = st;
    return;
  }
  *out = std::unique_ptr<specula::Communicator>(std::move(c));
}

__attribute__((visibility("default"))) int specula_nccl_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // extern "C"
