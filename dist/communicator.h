// Collectives across the ranks of a tensor-parallel group. Three implementations: a single rank
// (no-op), MPI for host tensors (dist/mpi_communicator.cc) and NCCL for GPU tensors
// (dist/nccl_communicator.cc). MPI and NCCL types never leave those files.
//
// Every collective waits at most timeout_s() (--collective-timeout-s). A rank that dies or hangs
// makes the others fail with an error naming the collective (`what`) and, where it can tell, the
// rank; never a hang. After a failure the communicator is broken: every later call fails at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"

namespace specula {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const char* name() const = 0;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  virtual double timeout_s() const = 0;

  // data[count] of `dtype` := its sum over the ranks, in place. `what` names the call site.
  virtual absl::Status AllReduceSum(void* data, int64_t count, DType dtype, absl::string_view what) = 0;
  // recv[size() * bytes] := every rank's send[bytes], in rank order.
  virtual absl::Status AllGather(const void* send, size_t bytes, void* recv, absl::string_view what) = 0;
  // data[bytes] := root's data[bytes] (bytes or a tensor: the layout is the caller's).
  virtual absl::Status Broadcast(void* data, size_t bytes, int32_t root, absl::string_view what) = 0;
  virtual absl::Status Barrier(absl::string_view what) = 0;

  // A message of any length from rank 0 to all (the step plans). On the other ranks it waits with
  // no timeout, since a server may be idle for hours between steps, but fails once rank 0 is gone.
  virtual absl::Status BroadcastMessage(std::string* msg, absl::string_view what) = 0;
};

// The size-1 group: every collective returns at once with the data as it is.
std::unique_ptr<Communicator> MakeSingleCommunicator();

// MPI_COMM_WORLD (MPI initialised once per process, with MPI_THREAD_SERIALIZED: one thread at a
// time calls in). Unimplemented when the binary was built without MPI.
absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(double timeout_s);
// The size of MPI_COMM_WORLD as the launcher sets it in the environment (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE), 1 when not launched by mpirun; read without initialising MPI.
int32_t LaunchedWorldSize();
// NCCL over `bootstrap` (an MPI group of one GPU per rank; it carries the unique id and the step
// plans): GPU tensors on `cuda_stream` (the rank's backend stream) of `device`. Unavailable when the
// build or the machine has no NCCL.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device,
                                                                   void* cuda_stream);
// GPUs visible to the NCCL module (0 without one).
int NcclDeviceCount();

// Ends MPI for the process: MPI_Finalize when `ok`, otherwise MPI_Abort, which stops every rank
// (no process is left behind when one fails). A no-op when MPI was never initialised.
void ShutdownMpi(bool ok);

}  // namespace specula
