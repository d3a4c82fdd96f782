#include "tools/experiment.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/flags.h"
#include "experiments/harness.h"
#include "experiments/spec.h"

#ifndef SPECULA_SOURCE_DIR
#define SPECULA_SOURCE_DIR "."
#endif

namespace specula {
namespace {

constexpr char kUsage[] = R"(usage: specula experiment run SPEC.textproto --out DIR [--force] [--no-progress]
       specula experiment report DIR [--out report.md] [--target-qps 10,100,1000] [--cost-per-hour 2.5]

run: sweeps the batching and speculation parameters of an experiment spec (experiments/experiment.proto,
as textproto; examples in experiments/specs/). Every point and repeat appends one JSON line to
DIR/results.jsonl; DIR/run.json records the spec, the commit, the build and the machine. Ctrl-C
stops after the current run's cleanup, leaving whole lines only; running the same command again runs
only the missing points. A different spec in the same DIR is refused.
  --out DIR        the output directory (created)
  --force          discard DIR's results and run every point again
  --no-progress    no progress line on stderr

report: DIR/report.md and PNG plots beside it (python3 and matplotlib, which scripts/install_deps.sh
installs): throughput and speedup against batch size, acceptance by position, latency against
request rate (online), the best configuration per batch size, and the capacity plan.
  --out PATH            where report.md goes (default DIR/report.md); the plots go beside it
  --target-qps LIST     the fleet's target loads, requests/s (default 10,100,1000)
  --cost-per-hour USD   one replica's cost per hour (default 2.5)
)";

std::atomic<bool> g_stop{false};
void OnSigint(int) { g_stop = true; }

absl::Status Run(int argc, char** argv) {
  if (argc < 1 || std::string(argv[0]).rfind("--", 0) == 0) {
    return absl::InvalidArgumentError("experiment run needs a spec: specula experiment run SPEC.textproto --out DIR");
  }
  const std::string spec_path = argv[0];
  auto flags = ParseFlags(argc - 1, argv + 1, {"out"}, {"force", "no-progress"});
  if (!flags.ok()) return flags.status();
  if (!flags->values.count("out")) return absl::InvalidArgumentError("experiment run needs --out DIR");
  auto spec = experiments::LoadSpec(spec_path);  // every error before anything runs
  if (!spec.ok()) return spec.status();
  experiments::HarnessOptions opt;
  opt.out_dir = flags->values["out"];
  opt.force = flags->switches.count("force") > 0;
  opt.progress = !flags->switches.count("no-progress");
  opt.stop = &g_stop;
  struct sigaction sa = {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  return experiments::RunExperiment(*spec, opt);
}

// The report is Python (matplotlib): run experiments/report.py from the source tree, or the script
// SPECULA_REPORT_SCRIPT names.
absl::Status Report(int argc, char** argv) {
  const char* env = std::getenv("SPECULA_REPORT_SCRIPT");
  const std::string script = env ? env : absl::StrCat(SPECULA_SOURCE_DIR, "/experiments/report.py");
  if (::access(script.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(script, ": the report script is missing (set SPECULA_REPORT_SCRIPT)"));
  }
  std::vector<char*> args = {const_cast<char*>("python3"), const_cast<char*>(script.c_str())};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp("python3", args.data());
  return absl::NotFoundError("python3 is not on PATH: the report needs python3 with matplotlib (scripts/install_deps.sh)");
}

}  // namespace

absl::Status RunExperimentCommand(int argc, char** argv) {
  const std::string sub = argc > 0 ? argv[0] : "";
  if (sub.empty() || sub == "--help" || sub == "help" || sub == "-h") {
    std::cout << kUsage;
    if (sub.empty()) return absl::InvalidArgumentError("experiment needs a subcommand: run or report");
    return absl::OkStatus();
  }
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help") {
      std::cout << kUsage;
      return absl::OkStatus();
    }
  }
  if (sub == "run") return Run(argc - 1, argv + 1);
  if (sub == "report") return Report(argc - 1, argv + 1);
  return absl::InvalidArgumentError(absl::StrCat("experiment: unknown subcommand '", sub, "' (run or report)"));
}

}  // namespace specula
