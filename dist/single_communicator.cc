#include "dist/communicator.h"

#include <cstring>

namespace specula {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  const char* name() const override { return "single"; }
  int32_t rank() const override { return 0; }
  int32_t size() const override { return 1; }
  double timeout_s() const override { return 0; }
  absl::Status AllReduceSum(void*, int64_t, DType, absl::string_view) override { return absl::OkStatus(); }
  absl::Status AllGather(const void* send, size_t bytes, void* recv, absl::string_view) override {
    if (send != recv) std::memmove(recv, send, bytes);
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, int32_t, absl::string_view) override { return absl::OkStatus(); }
  absl::Status Barrier(absl::string_view) override { return absl::OkStatus(); }
  absl::Status BroadcastMessage(std::string*, absl::string_view) override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleCommunicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace specula
