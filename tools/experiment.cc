#include "tools/experiment.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/flags.h"
#include "dist/communicator.h"
#include "core/status_macros.h"
#include "engine/engine_setup.h"
#include "experiments/harness.h"
#include "nlohmann/json.hpp"
#include "experiments/spec.h"

#ifndef SPECULA_SOURCE_DIR
#define SPECULA_SOURCE_DIR "."
#endif

namespace specula {
namespace {

constexpr char kUsage[] = R"(usage: specula experiment run SPEC.textproto --out DIR [--part I/N] [--force] [--no-progress]
                             [--tensor-parallel-size N [--collective-timeout-s S]]
       specula experiment report DIR... [--out report.md] [--target-qps 10,100,1000] [--cost-per-hour 2.5]
       specula experiment calibrate --model PATH [engine flags] --out FILE   (see calibrate --help)

run: sweeps the batching and speculation parameters of an experiment spec (experiments/experiment.proto,
as textproto; examples in experiments/specs/). Every point and repeat appends one JSON line to
DIR/results.jsonl; DIR/run.json records the spec, the commit, the build and the machine. Ctrl-C
stops after the current run's cleanup, leaving whole lines only; running the same command again runs
only the missing points. A different spec in the same DIR is refused.
  --out DIR        the output directory (created)
  --part I/N       run part I (0 to N-1) of N: the sweep's points in groups that differ only in
                   speculation (so each speedup's `none` baseline runs in the same part), group g in
                   part g mod N; the same spec splits the same way on every machine. Each part writes
                   its own DIR, and `experiment report` merges the parts' DIRs
  --force          discard DIR's results and run every point again
  --no-progress    no progress line on stderr
  --tensor-parallel-size N  shard every local point's target over N ranks: launch with
                   `mpirun -np N specula experiment run ...` (README, "Tensor parallelism"); rank 0
                   runs the sweep and writes DIR, the other ranks load each point's shard as it
                   starts. Points against an endpoint are not sharded.
  --collective-timeout-s S  a collective's timeout (default 60)

report: DIR/report.md and PNG plots beside it (python3 and matplotlib, which scripts/install_deps.sh
installs): throughput and speedup against batch size, acceptance by position, latency against
request rate (online), the best configuration per batch size, and the capacity plan. Several DIRs
are the parts of one run (--part): each must hold a complete part of the same spec, and every part
from 0 to N-1 must be there once; their run.json and results.jsonl are merged into --out's
directory (required then) as one run's, and the report is written from there.
  --out PATH            where report.md goes (default DIR/report.md); the plots go beside it
  --target-qps LIST     the fleet's target loads, requests/s (default 10,100,1000)
  --cost-per-hour USD   one replica's cost per hour (default 2.5)
)";

std::atomic<bool> g_stop{false};
void OnSigint(int) { g_stop = true; }

// A point's engine options from rank 0 to the other ranks, as JSON after a tag (so that a rank that
// is out of step, reading a step plan here, fails instead of misreading it). Empty: the sweep ended.
constexpr char kPointTag[] = "experiment-point ";

absl::StatusOr<EngineOptions> DecodePoint(const std::string& msg) {
  const size_t tag = sizeof(kPointTag) - 1;
  auto options = msg.compare(0, tag, kPointTag) == 0 ? EngineOptionsFromJson(msg.substr(tag))
                                                      : absl::InvalidArgumentError("no tag");
  if (!options.ok()) {
    return absl::InternalError(absl::StrCat("experiment run: rank 0 sent ", msg.size(),
                                            " bytes that are not a point's engine: the ranks are out of step"));
  }
  return options;
}

// A rank other than 0: load each point's shard as rank 0 announces it, and run its forwards
// (LoadEngine returns once rank 0's engine is gone), until rank 0 sends the end.
absl::Status FollowSweep(const std::shared_ptr<Communicator>& group) {
  while (true) {
    std::string msg;
    if (absl::Status st = group->BroadcastMessage(&msg, "experiment point"); !st.ok()) return st;
    if (msg.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(EngineOptions options, DecodePoint(msg));
    // An engine that fails to load fails on rank 0 too (the same checks, before any collective),
    // which ends the sweep: the next message is the end.
    if (auto loaded = LoadEngine(options, group); !loaded.ok()) {
      std::cerr << "rank " << group->rank() << ": " << loaded.status().message() << "\n";
    }
  }
}

absl::Status Run(int argc, char** argv) {
  if (argc < 1 || std::string(argv[0]).rfind("--", 0) == 0) {
    return absl::InvalidArgumentError("experiment run needs a spec: specula experiment run SPEC.textproto --out DIR");
  }
  const std::string spec_path = argv[0];
  auto flags = ParseFlags(argc - 1, argv + 1, {"out", "part", "tensor-parallel-size", "collective-timeout-s"},
                          {"force", "no-progress"});
  if (!flags.ok()) return flags.status();
  if (!flags->values.count("out")) return absl::InvalidArgumentError("experiment run needs --out DIR");
  int32_t tp_size = 1;
  double timeout_s = 60;
  for (auto st : {GetNumber(*flags, "tensor-parallel-size", &tp_size), GetNumber(*flags, "collective-timeout-s", &timeout_s)}) {
    if (!st.ok()) return st;
  }
  if (tp_size < 1) return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size must be >= 1, got ", tp_size));
  if (!(timeout_s > 0)) return absl::InvalidArgumentError(absl::StrCat("--collective-timeout-s must be positive, got ", timeout_s));
  experiments::Part part;
  if (auto it = flags->values.find("part"); it != flags->values.end()) {
    auto p = experiments::ParsePart(it->second);
    if (!p.ok()) return p.status();
    part = *p;
  }
  auto spec = experiments::LoadSpec(spec_path);  // every error before anything runs
  if (!spec.ok()) return spec.status();
  std::shared_ptr<Communicator> group;
  if (tp_size > 1) {
    auto g = TensorParallelGroup(tp_size, timeout_s);
    if (!g.ok()) return g.status();
    group = *g;
    if (group->rank() != 0) return FollowSweep(group);
  }
  experiments::HarnessOptions opt;
  opt.out_dir = flags->values["out"];
  opt.force = flags->switches.count("force") > 0;
  opt.part = part;
  opt.progress = !flags->switches.count("no-progress");
  opt.stop = &g_stop;
  struct sigaction sa = {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  if (group == nullptr) return experiments::RunExperiment(*spec, opt);
  opt.group = group;
  opt.before_load = [&group](const EngineOptions& options) {
    std::string msg = kPointTag + EngineOptionsToJson(options);
    return group->BroadcastMessage(&msg, "experiment point");
  };
  absl::Status st = experiments::RunExperiment(*spec, opt);
  std::string end;  // the other ranks wait for the next point: none
  if (absl::Status sent = group->BroadcastMessage(&end, "experiment end"); !sent.ok() && st.ok()) st = sent;
  return st;
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
  if (sub == "calibrate") return RunCalibrate(argc - 1, argv + 1);
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help") {
      std::cout << kUsage;
      return absl::OkStatus();
    }
  }
  if (sub == "run") return Run(argc - 1, argv + 1);
  if (sub == "report") return Report(argc - 1, argv + 1);
  return absl::InvalidArgumentError(absl::StrCat("experiment: unknown subcommand '", sub, "' (run, report or calibrate)"));
}

}  // namespace specula
