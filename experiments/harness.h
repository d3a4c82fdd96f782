// `specula experiment run`: every point and repeat of a spec, one results.jsonl line each, resumable.
//
// DIR/run.json records the spec (and its hash), the git commit, the build, the machine and the date,
// and under --part which part of the sweep DIR holds: "part": {"index", "count", "keys": the part's
// point keys in order, "sweep_points": the whole sweep's count}.
// DIR/results.jsonl gets one line per run, written whole and synced before the next run starts, so
// an interrupted sweep (Ctrl-C, a kill, a crash) leaves only whole lines, but for at most a torn last
// line that the next run drops. Rerunning the same spec runs only the (point, repeat) pairs that
// have no line; a different spec in the same DIR is refused unless `force`, which starts over.
// With the spec's record_trace, each run first writes DIR/traces/TraceFileName(key, repeat), whole,
// and its line names it under "trace" (relative to DIR).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "dist/communicator.h"
#include "engine/options.h"
#include "experiments/parts.h"
#include "experiments/spec.h"

namespace specula::experiments {

struct HarnessOptions {
  std::string out_dir;
  bool force = false;                       // discard DIR's results and rerun everything
  const std::atomic<bool>* stop = nullptr;  // Ctrl-C: stop after (or within) the current run
  bool progress = true;                     // the progress line on stderr
  // Passed to every run (RunHooks): the tensor-parallel group and the hook before an engine loads.
  std::shared_ptr<Communicator> group;
  std::function<absl::Status(const EngineOptions&)> before_load;
  // `--part I/N`: only the points of this part (experiments/parts.h); run.json records which, and a
  // DIR holding another part of the spec is refused as another spec's is.
  Part part;
};

// Errors: a DIR holding another spec's results (without force), an unwritable DIR, a malformed
// results.jsonl line (named by line), a run that fails (its point named), and CancelledError when
// `stop` was set (results.jsonl then holds the runs that finished).
absl::Status RunExperiment(const LoadedSpec& spec, const HarnessOptions& opt);

// The (key, repeat) pairs that results.jsonl at `path` holds (none if it does not exist). A torn
// last line (no newline at its end) is cut off the file; `*dropped` says whether one was.
absl::StatusOr<std::set<std::pair<std::string, int>>> ReadDoneRuns(const std::string& path, bool* dropped);

// The trace file of a run: "<key>-r<repeat>.jsonl", the key's characters other than letters, digits
// and ._,=+- written as '_'; a name that would be long keeps its head and adds the key's hash.
std::string TraceFileName(const std::string& key, int repeat);

}  // namespace specula::experiments
