// How a `specula` command ends, shared by the binary (tools/specula_main.cc) and the module of the
// serving commands (tools/cli_module.cc): the error on stderr, then MPI shut down (under mpirun a
// failed rank stops every rank, so none is left waiting). Each of the two links its own copy of
// dist/, so each shuts down the MPI it started.
#pragma once

#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "dist/communicator.h"

namespace specula {

inline int FinishCommand(const std::string& cmd, const absl::Status& st) {
  if (!st.ok()) {
    std::cerr << "specula " << cmd << ": " << (absl::IsCancelled(st) ? "" : "error: ") << st.message() << "\n";
    ShutdownMpi(false);
    return absl::IsCancelled(st) ? 130 : 1;
  }
  ShutdownMpi(true);
  return 0;
}

}  // namespace specula
