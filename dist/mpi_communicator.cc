// The MPI communicator: host tensors over MPI_COMM_WORLD (OpenMPI's shared-memory transport on one
// machine). Collectives are non-blocking (MPI_I*) and polled, so that each one can time out and can
// notice a peer that died: MPI itself would wait forever.
// The C API only: the deprecated C++ bindings need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dist/communicator.h"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

// mpirun sends SIGTERM to every rank once one has died; a rank waiting in a collective then reports
// which collective and which peer instead of vanishing without a word.
volatile sig_atomic_t g_terminated = 0;
void OnTerminate(int) { g_terminated = 1; }

bool g_initialized_here = false;

// Time spent in collectives by this process (SPECULA_COMM_STATS=1 prints it at exit): the
// all-reduce share of a step, transfer and waiting for the slowest rank together.
struct Stats {
  int64_t calls[4] = {0, 0, 0, 0};  // all_reduce, all_gather, broadcast (incl. step plans), barrier
  double seconds[4] = {0, 0, 0, 0};
  // Waits for the next step plan (ranks other than 0): rank 0's time outside the target's forward
  // (scheduling, the draft, sampling and verification), during which the other ranks are idle.
  int64_t idle_calls = 0;
  double idle_seconds = 0;
  Clock::time_point start = Clock::now();
} g_stats;

int OpIndex(const char* op) {
  return op[0] == 'a' ? (op[4] == 'r' ? 0 : 1) : op[0] == 'b' && op[1] == 'r' ? 2 : 3;
}

// True when the process is gone or a zombie (killed, not yet reaped by the launcher).
bool ProcessGone(int64_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int32_t rank, int32_t size, double timeout_s, std::vector<int64_t> pids,
                  std::vector<bool> same_host)
      : rank_(rank), size_(size), timeout_s_(timeout_s), pids_(std::move(pids)), same_host_(std::move(same_host)) {}

  const char* name() const override { return "mpi"; }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  double timeout_s() const override { return timeout_s_; }

  absl::Status AllReduceSum(void* data, int64_t count, DType dtype, absl::string_view what) override {
    if (dtype != DType::kF32) {
      return absl::UnimplementedError(absl::StrCat("all_reduce '", what, "': MPI sums f32 only, not ", DTypeName(dtype)));
    }
    if (count > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("all_reduce '", what, "': ", count, " elements"));
    return Run("all_reduce", what, false, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
    });
  }

  absl::Status AllGather(const void* send, size_t bytes, void* recv, absl::string_view what) override {
    if (bytes > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("all_gather '", what, "': ", bytes, " bytes"));
    return Run("all_gather", what, false, [&](MPI_Request* r) {
      return MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                            MPI_COMM_WORLD, r);
    });
  }

  absl::Status Broadcast(void* data, size_t bytes, int32_t root, absl::string_view what) override {
    if (bytes > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("broadcast '", what, "': ", bytes, " bytes"));
    return Run("broadcast", what, false, [&](MPI_Request* r) {
      return MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, r);
    });
  }

  absl::Status Barrier(absl::string_view what) override {
    return Run("barrier", what, false, [&](MPI_Request* r) { return MPI_Ibarrier(MPI_COMM_WORLD, r); });
  }

  absl::Status BroadcastMessage(std::string* msg, absl::string_view what) override {
    uint64_t len = rank_ == 0 ? msg->size() : 0;
    // The length: the other ranks may wait for it indefinitely (an idle server).
    absl::Status st = Run("broadcast", absl::StrCat(what, " (length)"), rank_ != 0,
                          [&](MPI_Request* r) { return MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, r); });
    if (!st.ok()) return st;
    if (rank_ != 0) msg->resize(len);
    if (len == 0) return absl::OkStatus();
    return Broadcast(msg->data(), len, 0, what);
  }

 private:
  // Starts a collective with `start` and polls it to the end, the timeout, or a dead peer.
  // `idle`: no timeout (see BroadcastMessage).
  template <typename Start>
  absl::Status Run(const char* op, absl::string_view what, bool idle, Start start) {
    if (!broken_.ok()) return broken_;
    const int64_t seq = ++calls_;
    MPI_Request req;
    if (int rc = start(&req); rc != MPI_SUCCESS) return Fail(op, what, seq, ErrorString(rc));
    const Clock::time_point begin = Clock::now();
    Clock::time_point next_check = begin;
    for (int64_t spins = 0;; ++spins) {
      int done = 0;
      if (int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) return Fail(op, what, seq, ErrorString(rc));
      if (done) {
        const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        if (idle) {  // an idle wait for the next step plan is not the step's time
          g_stats.idle_calls += 1;
          g_stats.idle_seconds += seconds;
        } else {
          g_stats.calls[OpIndex(op)] += 1;
          g_stats.seconds[OpIndex(op)] += seconds;
        }
        return absl::OkStatus();
      }
      // Spin briefly (a step's all-reduces are microseconds apart), then let other ranks and
      // threads have the core: these machines run more ranks than cores.
      if (spins > 2000) {
        if (idle) {
          ::usleep(spins > 200000 ? 2000 : 100);
        } else {
          sched_yield();
        }
      }
      if ((spins & 31) != 0) continue;
      const Clock::time_point now = Clock::now();
      if (now < next_check) continue;
      next_check = now + std::chrono::milliseconds(2);
      for (int32_t r = 0; r < size_; ++r) {
        if (r != rank_ && same_host_[r] && ProcessGone(pids_[r])) {
          return Fail(op, what, seq, absl::StrCat("rank ", r, " (pid ", pids_[r], ") has exited"),
                      absl::StatusCode::kUnavailable);
        }
      }
      if (g_terminated) {
        return Fail(op, what, seq, "stopped by SIGTERM (the launcher stops every rank when one fails)",
                    absl::StatusCode::kAborted);
      }
      const double waited = std::chrono::duration<double>(now - begin).count();
      if (!idle && waited > timeout_s_) {
        return Fail(op, what, seq,
                    absl::StrFormat("timed out after %.1f s (--collective-timeout-s %g): another rank never "
                                    "joined",
                                    waited, timeout_s_),
                    absl::StatusCode::kDeadlineExceeded);
      }
    }
  }

  absl::Status Fail(const char* op, absl::string_view what, int64_t seq, const std::string& why,
                    absl::StatusCode code = absl::StatusCode::kInternal) {
    broken_ = absl::Status(code, absl::StrCat("rank ", rank_, " of ", size_, ": collective ", op, " '", what,
                                              "' (call ", seq, ") failed: ", why));
    return broken_;
  }

  static std::string ErrorString(int rc) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, buf, &len);
    return std::string(buf, len);
  }

  int32_t rank_, size_;
  double timeout_s_;
  std::vector<int64_t> pids_;   // [size] each rank's process id
  std::vector<bool> same_host_; // [size] whether that rank runs on this machine
  int64_t calls_ = 0;
  absl::Status broken_;
};

}  // namespace

int32_t LaunchedWorldSize() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var); v != nullptr && std::atoi(v) > 0) return std::atoi(v);
  }
  return 1;
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(double timeout_s) {
  if (!(timeout_s > 0)) return absl::InvalidArgumentError(absl::StrCat("--collective-timeout-s must be positive, got ", timeout_s));
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      return absl::UnavailableError("MPI_Init_thread failed");
    }
    g_initialized_here = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      return absl::FailedPreconditionError("this MPI library does not offer MPI_THREAD_SERIALIZED");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct sigaction old {};
    if (sigaction(SIGTERM, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGTERM, OnTerminate);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Each rank's pid and host, so that a waiting rank can tell which peer died.
  struct Id {
    int64_t pid;
    char host[64];
  } me{}, *all = nullptr;
  std::vector<Id> ids(size);
  all = ids.data();
  me.pid = ::getpid();
  ::gethostname(me.host, sizeof(me.host) - 1);
  if (int rc = MPI_Allgather(&me, sizeof(Id), MPI_BYTE, all, sizeof(Id), MPI_BYTE, MPI_COMM_WORLD); rc != MPI_SUCCESS) {
    return absl::UnavailableError("MPI_Allgather of the ranks' process ids failed");
  }
  std::vector<int64_t> pids(size);
  std::vector<bool> same_host(size);
  for (int r = 0; r < size; ++r) {
    pids[r] = ids[r].pid;
    same_host[r] = std::strncmp(ids[r].host, me.host, sizeof(me.host)) == 0;
  }
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(rank, size, timeout_s, std::move(pids), std::move(same_host)));
}

void ShutdownMpi(bool ok) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (const char* v = std::getenv("SPECULA_COMM_STATS"); v != nullptr && v[0] == '1' && !finalized) {
    int rank = 0;
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const double total = std::chrono::duration<double>(Clock::now() - g_stats.start).count();
    long rss_kb = 0, hwm_kb = 0;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) rss_kb = std::atol(line.c_str() + 6);
      if (line.rfind("VmHWM:", 0) == 0) hwm_kb = std::atol(line.c_str() + 6);
    }
    std::fprintf(stderr,
                 "[specula] rank %d collectives: all_reduce %lld calls %.3f s, all_gather %lld calls %.3f s, "
                 "broadcast %lld calls %.3f s, barrier %lld calls %.3f s; waiting for step plans %lld calls %.3f s; "
                 "%.3f s since start; RSS %.1f MB (peak %.1f MB)\n",
                 rank, static_cast<long long>(g_stats.calls[0]), g_stats.seconds[0],
                 static_cast<long long>(g_stats.calls[1]), g_stats.seconds[1], static_cast<long long>(g_stats.calls[2]),
                 g_stats.seconds[2], static_cast<long long>(g_stats.calls[3]), g_stats.seconds[3],
                 static_cast<long long>(g_stats.idle_calls), g_stats.idle_seconds, total, rss_kb / 1024.0,
                 hwm_kb / 1024.0);
  }
  if (!initialized || finalized || !g_initialized_here) return;
  if (ok) {
    MPI_Finalize();
  } else {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace specula
