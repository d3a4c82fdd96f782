// `specula experiment calibrate`: the engine's flags, a grid, and the step-cost file it writes
// (experiments/calibrate.h).
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "experiments/calibrate.h"
#include "spec/cost_cache.h"
#include "tools/engine_flags.h"
#include "tools/experiment.h"

namespace specula {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] = R"(usage: specula experiment calibrate --model PATH [engine flags] --out FILE
                                   [--batches 1,2,4,8,16,32] [--contexts 32,256,1024] [--ks 1,2,4]
                                   [--steps 6] [--load 2,6,12|none] [--load-requests 48]
                                   [--no-progress]

Times whole engine steps on this machine (prefill chunks, decodes, and verifications of k drafts
per sequence) over a grid of batch sizes and contexts, and writes a step-cost file for
`specula simulate --cost FILE` and `specula plan --cost FILE`. With --spec-method draft the draft
model is profiled too. The engine flags are `specula serve`'s (threads, KV dtype, quantization,
--max-num-batched-tokens, --num-blocks): profile the configuration you will simulate. A shape whose
batch x context passes 16384 tokens, or whose context the model cannot hold, is skipped.
Then served traffic: Poisson arrivals of random prompts (16 to the largest context) and outputs
(16 to 96 tokens) at rates that keep each --load level of requests in flight, every step timed:
the mixed batches and the host work of arrivals and deliveries that serving has. Last, a request's
time outside the steps (request_overhead_s). The simulator fits the medians of every shape; with
--step-jitter it draws each step's variation from all of them.

  --out FILE        the step-cost file (JSON; written whole)
  --batches LIST    batch sizes (default 1,2,4,8,16,32)
  --contexts LIST   prompt lengths (default 32,256,1024)
  --ks LIST         drafts per sequence of the verification steps (default 1,2,4)
  --steps N         timed steps per shape and k: at least N (default 6) and 0.25 s, at most 64
  --load LIST       requests in flight of each served-traffic level (default 2,6,12; none: skip)
  --load-requests N requests sent at each level (default 48)
  --no-progress     no progress line on stderr

)";

absl::StatusOr<std::vector<int32_t>> IntList(const Flags& f, const char* name, std::vector<int32_t> fallback) {
  auto it = f.values.find(name);
  if (it == f.values.end()) return fallback;
  std::vector<int32_t> out;
  for (absl::string_view v : absl::StrSplit(it->second, ',')) {
    int32_t x;
    if (!absl::SimpleAtoi(v, &x) || x < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", std::string(v), "' is not an integer >= 1"));
    }
    out.push_back(x);
  }
  return out;
}

}  // namespace

absl::Status RunCalibrate(int argc, char** argv) {
  std::set<std::string> known = kEngineFlags, switches = kEngineSwitches;
  known.insert({"out", "batches", "contexts", "ks", "steps", "load", "load-requests"});
  switches.insert({"no-progress", "help"});
  ASSIGN_OR_RETURN(Flags flags, ParseFlags(argc, argv, known, switches));
  if (flags.switches.count("help")) {
    std::cout << kUsage << kEngineFlagsHelp;
    return absl::OkStatus();
  }
  if (!flags.values.count("out")) return absl::InvalidArgumentError("calibrate needs --out FILE");
  experiments::CalibrateOptions o;
  ASSIGN_OR_RETURN(o.batches, IntList(flags, "batches", o.batches));
  ASSIGN_OR_RETURN(o.contexts, IntList(flags, "contexts", o.contexts));
  ASSIGN_OR_RETURN(o.ks, IntList(flags, "ks", o.ks));
  RETURN_IF_ERROR(GetNumber(flags, "steps", &o.decode_steps));
  if (o.decode_steps < 1) return absl::InvalidArgumentError("--steps: must be >= 1");
  if (flags.values.count("load") && flags.values.at("load") == "none") {
    o.load_concurrency.clear();
  } else {
    ASSIGN_OR_RETURN(o.load_concurrency, IntList(flags, "load", o.load_concurrency));
  }
  RETURN_IF_ERROR(GetNumber(flags, "load-requests", &o.load_requests));
  if (o.load_requests < 1) return absl::InvalidArgumentError("--load-requests: must be >= 1");
  ASSIGN_OR_RETURN(EngineOptions options, EngineOptionsFromFlags(flags));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedEngine> e, LoadEngine(options, nullptr));
  if (!flags.switches.count("no-progress")) {
    o.progress = [](int32_t done, int32_t total) {
      std::fprintf(stderr, "\r[calibrate] %d/%d shapes and loads", done, total);
      if (done == total) std::fputs("\n", stderr);
    };
  }
  const std::time_t start = std::time(nullptr);
  ASSIGN_OR_RETURN(json out, experiments::Calibrate(*e, o));
  json identity = MachineIdentity();
  ASSIGN_OR_RETURN(CostIdentity model, ModelFileIdentity(options.target.model));
  for (const auto& [k, v] : model) identity[k] = v;
  identity["role"] = "target";
  identity["model"] = options.target.model;
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&start));
  out["format"] = "specula.step_cost.v1";
  out["identity"] = identity;
  out["date"] = date;
  std::string command = "specula experiment calibrate";
  for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
  out["command"] = command;
  const std::string path = flags.values.at("out"), tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << out.dump(1) << "\n";
    if (!f) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write ", path));
  std::fprintf(stderr, "[calibrate] %zu steps in %.0f s: %s\n", out["steps"].size(), std::difftime(std::time(nullptr), start),
               path.c_str());
  return absl::OkStatus();
}

}  // namespace specula
