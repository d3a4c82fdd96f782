// MakeMpiCommunicator for builds without MPI: tensor parallelism over processes is refused.
#include "dist/communicator.h"

namespace specula {

int32_t LaunchedWorldSize() { return 1; }
absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(double) {
  return absl::UnimplementedError("this specula was built without MPI (apt install libopenmpi-dev openmpi-bin)");
}
void ShutdownMpi(bool) {}

}  // namespace specula
