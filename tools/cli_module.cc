// libspecula_cli.so: the commands with gRPC, Protobuf and HTTP underneath (serve, bench-serve,
// experiment), which tools/specula_main.cc opens for those commands only. Linked into the binary,
// their 50-odd shared libraries took 6 ms of dynamic loading from every `specula generate`.
#include <string>

#include "tools/bench_serve.h"
#include "tools/command_exit.h"
#include "tools/experiment.h"
#include "tools/serve.h"

// argv as main's: argv[1] is the command. Returns the process's exit code.
extern "C" __attribute__((visibility("default"))) int specula_cli_main(int argc, char** argv) {
  const std::string cmd = argv[1];
  absl::Status st;
  if (cmd == "serve") {
    st = specula::RunServe(argc - 2, argv + 2);
  } else if (cmd == "bench-serve") {
    st = specula::RunBenchServe(argc - 2, argv + 2);
  } else if (cmd == "experiment") {
    st = specula::RunExperimentCommand(argc - 2, argv + 2);
  } else {
    st = absl::InvalidArgumentError("not a command of this module");
  }
  return specula::FinishCommand(cmd, st);
}
