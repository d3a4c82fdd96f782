#include "experiments/harness.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "experiments/runner.h"

#ifndef SPECULA_SOURCE_DIR
#define SPECULA_SOURCE_DIR "."
#endif
#ifndef SPECULA_BUILD_TYPE
#define SPECULA_BUILD_TYPE "unknown"
#endif

namespace specula::experiments {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Command(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  return Trim(out);
}

// The commit the binary was built from, "-dirty" with uncommitted changes to tracked files.
std::string GitCommit() {
  const std::string dir = SPECULA_SOURCE_DIR;
  std::string commit = Command(absl::StrCat("git -C '", dir, "' rev-parse --short=12 HEAD 2>/dev/null"));
  if (commit.empty()) return "unknown";
  if (!Command(absl::StrCat("git -C '", dir, "' status --porcelain --untracked-files=no 2>/dev/null")).empty()) {
    commit += "-dirty";
  }
  return commit;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return Trim(line.substr(line.find(':') + 2));
  }
  return "unknown";
}

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

nlohmann::json RunInfo(const LoadedSpec& s, const std::vector<Point>& points, size_t sweep_points, Part part) {
  nlohmann::json j;
  const nlohmann::json spec = SpecJson(s.spec);
  j["name"] = s.spec.name();
  j["spec_path"] = s.path;
  j["spec_hash"] = s.hash;
  j["spec"] = spec;
  j["spec_text"] = s.text;
  j["mode"] = s.spec.mode() == v1::ONLINE ? "ONLINE" : "OFFLINE";
  j["endpoint"] = s.spec.endpoint().empty() ? nlohmann::json() : nlohmann::json(s.spec.endpoint());
  j["workload"] = spec.value("workload", nlohmann::json::object());
  nlohmann::json slo = nlohmann::json::object();  // only the bounds that are set
  if (s.spec.slo().ttft_ms() > 0) slo["ttft_ms"] = s.spec.slo().ttft_ms();
  if (s.spec.slo().tpot_ms() > 0) slo["tpot_ms"] = s.spec.slo().tpot_ms();
  if (s.spec.slo().e2el_ms() > 0) slo["e2el_ms"] = s.spec.slo().e2el_ms();
  j["slo"] = slo;
  j["points"] = points.size();
  if (!part.whole()) {
    nlohmann::json keys = nlohmann::json::array();
    for (const Point& p : points) keys.push_back(p.Key());
    j["part"] = {{"index", part.index}, {"count", part.count}, {"keys", keys}, {"sweep_points", sweep_points}};
  }
  j["repeats"] = s.spec.repeats();
  j["git_commit"] = GitCommit();
  j["build_type"] = SPECULA_BUILD_TYPE;
  j["cpu"] = CpuModel();
  j["threads"] = std::thread::hardware_concurrency();
#ifdef __AVX512F__
  j["simd"] = "avx512";
#else
  j["simd"] = "avx2";
#endif
  j["gpu"] = nullptr;  // CPU runs only: the CUDA backend is not in the experiment specs yet
  j["date"] = UtcNow();
  return j;
}

absl::Status WriteFileSynced(const std::string& path, const std::string& data, bool append) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": write failed"));
    }
    off += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  return absl::OkStatus();
}

std::string Duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? absl::StrFormat("%dh%02dm", t / 3600, t / 60 % 60) : absl::StrFormat("%dm%02ds", t / 60, t % 60);
}

// The progress line: "[experiment] run 12/108 | point 6/54 (draft k=4, ...) repeat 2/2 | requests
// 40/64 | ETA 3m10s". On a terminal one line redrawn; otherwise a line per finished run.
class Progress {
 public:
  Progress(bool enabled, int total_runs) : enabled_(enabled), tty_(::isatty(2)), total_(total_runs) {}
  void Start(int run, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    run_ = run;
    what_ = std::move(what);
    requests_ = "";
    Draw();
  }
  void Requests(int done, int total) {
    std::lock_guard<std::mutex> lock(mu_);
    requests_ = absl::StrCat(" | requests ", done, "/", total);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ > std::chrono::milliseconds(200) || done == total) {
      last_ = now;
      Draw();
    }
  }
  void Finished(double run_seconds, const std::string& result) {
    std::lock_guard<std::mutex> lock(mu_);
    spent_ += run_seconds;
    ++executed_;
    if (!enabled_) return;
    if (tty_) std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "[experiment] run %d/%d %s: %s (%.1f s) ETA %s\n", run_, total_, what_.c_str(),
                 result.c_str(), run_seconds, Eta().c_str());
  }

 private:
  std::string Eta() const {
    if (executed_ == 0) return "?";
    return Duration(spent_ / executed_ * (total_ - run_));
  }
  void Draw() {
    if (!enabled_ || !tty_) return;
    std::fprintf(stderr, "\r\033[K[experiment] run %d/%d %s%s | ETA %s", run_, total_, what_.c_str(), requests_.c_str(),
                 Eta().c_str());
    std::fflush(stderr);
  }
  const bool enabled_, tty_;
  const int total_;
  std::mutex mu_;
  int run_ = 0, executed_ = 0;
  double spent_ = 0;
  std::string what_, requests_;
  std::chrono::steady_clock::time_point last_{};
};

// The progress line's short name of a point: its label and the dimensions users sweep most.
std::string Brief(const Point& p) {
  std::string out = p.Label();
  if (!p.remote) absl::StrAppend(&out, ", max_num_seqs ", p.max_num_seqs);
  absl::StrAppend(&out, ", T ", p.temperature);
  if (p.request_rate) absl::StrAppend(&out, ", ", *p.request_rate, " req/s");
  return out;
}

}  // namespace

absl::StatusOr<std::set<std::pair<std::string, int>>> ReadDoneRuns(const std::string& path, bool* dropped) {
  *dropped = false;
  std::set<std::pair<std::string, int>> done;
  if (::access(path.c_str(), F_OK) != 0) return done;
  auto text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  std::string body = *text;
  if (!body.empty() && body.back() != '\n') {
    // A run cut off mid-write: drop its torn line, which the next run redoes.
    body.resize(body.find_last_of('\n') == std::string::npos ? 0 : body.find_last_of('\n') + 1);
    if (auto st = WriteFileSynced(path, body, false); !st.ok()) return st;
    *dropped = true;
  }
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
    ++line_no;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("key") || !j["key"].is_string() || !j.contains("repeat") ||
        !j["repeat"].is_number_integer()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": not a results line (JSON with \"key\" and \"repeat\"); ",
                                              "move the file away or pass --force"));
    }
    done.insert({j["key"].get<std::string>(), j["repeat"].get<int>()});
  }
  return done;
}

std::string TraceFileName(const std::string& key, int repeat) {
  std::string name;
  for (char c : key) name += absl::ascii_isalnum(c) || (c != 0 && std::strchr("._,=+-", c) != nullptr) ? c : '_';
  if (name.empty() || name[0] == '.') name.insert(0, "_");  // never hidden, never "." or ".."
  if (name.size() > 200) {  // a file name holds 255 bytes (with ".tmp"): the head, and the whole key's hash
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    name = absl::StrCat(name.substr(0, 180), "-", absl::Hex(h, absl::kZeroPad16));
  }
  return absl::StrCat(name, "-r", repeat, ".jsonl");
}

namespace {

// "part 1/3", or "the whole sweep": what a run.json holds, or what a run asks for.
std::string PartName(Part part) {
  return part.whole() ? "the whole sweep" : absl::StrCat("part ", part.index, "/", part.count);
}
std::string PartName(const nlohmann::json& run) {
  if (!run.is_object() || !run.contains("part") || !run["part"].is_object()) return PartName(Part{});
  return PartName(Part{run["part"].value("index", 0), run["part"].value("count", 1)});
}

// Creates DIR and checks that it holds this spec's results (or none), of the same part; with `force`,
// drops them.
absl::Status PrepareOutDir(const LoadedSpec& spec, const HarnessOptions& opt) {
  const std::string& dir = opt.out_dir;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create the output directory"));
  }
  const std::string run_path = dir + "/run.json", results_path = dir + "/results.jsonl";
  const bool had_run = ::access(run_path.c_str(), F_OK) == 0, had_results = ::access(results_path.c_str(), F_OK) == 0;
  if (!opt.force && had_run) {
    auto text = ReadTextFile(run_path);
    nlohmann::json old = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    const std::string old_hash = old.is_object() ? old.value("spec_hash", "") : "";
    if (old_hash != spec.hash) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " holds the results of another spec (", old.is_object() ? old.value("spec_path", "?") : "?", ", hash ",
          old_hash.empty() ? "unreadable" : old_hash, "; this one is ", spec.path, ", hash ", spec.hash,
          "). Pass --force to discard them, or choose another --out"));
    }
    if (std::string held = PartName(old), asked = PartName(opt.part); held != asked) {
      return absl::FailedPreconditionError(absl::StrCat(dir, " holds ", held, " of this spec; this run is ", asked,
                                                        ". Pass --force to discard it, or choose another --out"));
    }
  } else if (!opt.force && had_results) {
    return absl::FailedPreconditionError(absl::StrCat(results_path, " exists without run.json: not an experiment's ",
                                                      "directory. Pass --force to discard it, or choose another --out"));
  }
  if (opt.force) ::unlink(results_path.c_str());
  if (spec.spec.record_trace() && ::mkdir((dir + "/traces").c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(dir, "/traces: cannot create the traces directory"));
  }
  return absl::OkStatus();
}

// One run of one point: its results line (with "trace", the trace's path relative to DIR, when the
// spec records traces; the runner wrote the trace whole before returning).
absl::StatusOr<nlohmann::json> RunOne(const LoadedSpec& spec, const Point& p, int repeat, const HarnessOptions& opt,
                                      Progress& progress) {
  RunHooks hooks;
  hooks.stop = opt.stop;
  hooks.on_progress = [&](int32_t d, int32_t n) { progress.Requests(d, n); };
  hooks.group = opt.group;
  hooks.before_load = opt.before_load;
  const std::string trace = spec.spec.record_trace() ? "traces/" + TraceFileName(p.Key(), repeat) : "";
  if (!trace.empty()) hooks.trace_path = opt.out_dir + "/" + trace;
  const auto t0 = std::chrono::steady_clock::now();
  auto m = RunPoint(spec, p, hooks);
  if (!m.ok()) return m.status();
  nlohmann::json line = {{"key", p.Key()}, {"repeat", repeat}, {"point", p.Json()}};
  line.update(*m);
  if (!trace.empty()) line["trace"] = trace;
  line["elapsed_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return line;
}

}  // namespace

absl::Status RunExperiment(const LoadedSpec& spec, const HarnessOptions& opt) {
  RETURN_IF_ERROR(PrepareOutDir(spec, opt));
  const std::string run_path = opt.out_dir + "/run.json", results_path = opt.out_dir + "/results.jsonl";
  const std::vector<Point> sweep = ExpandSweep(spec.spec);
  const std::vector<Point> points = PointsOfPart(sweep, opt.part);
  const int repeats = spec.spec.repeats();
  bool dropped = false;
  auto done = ReadDoneRuns(results_path, &dropped);
  if (!done.ok()) return done.status();
  if (dropped) std::fprintf(stderr, "[experiment] %s: dropped a torn last line (a run cut off mid-write)\n", results_path.c_str());
  if (auto st = WriteFileSynced(run_path, RunInfo(spec, points, sweep.size(), opt.part).dump(2) + "\n", false); !st.ok()) {
    return st;
  }

  const int total = static_cast<int>(points.size()) * repeats;
  int already = 0;
  for (const Point& p : points) {
    for (int r = 0; r < repeats; ++r) already += done->count({p.Key(), r});
  }
  std::fprintf(stderr, "[experiment] %s%s: %zu points x %d repeats = %d runs; %d done, %d to run -> %s\n",
               spec.spec.name().c_str(),
               opt.part.whole() ? "" : absl::StrCat(", ", PartName(opt.part), " (of ", sweep.size(), " points)").c_str(),
               points.size(), repeats, total, already, total - already, results_path.c_str());
  Progress progress(opt.progress, total);
  int run_index = 0, finished = already;
  // Repeat-major: every point once, then every point again. The machines are shared and noisy; a
  // slow minute then touches one repeat of many points instead of every repeat of a few, and the
  // report's medians drop it.
  for (int r = 0; r < repeats; ++r) {
    for (size_t pi = 0; pi < points.size(); ++pi) {
      const Point& p = points[pi];
      ++run_index;
      if (done->count({p.Key(), r})) continue;
      progress.Start(run_index, absl::StrCat("| point ", pi + 1, "/", points.size(), " (", Brief(p), ") repeat ", r + 1,
                                             "/", repeats));
      auto line = RunOne(spec, p, r, opt, progress);
      if (absl::IsCancelled(line.status()) || (opt.stop && opt.stop->load())) {
        if (::isatty(2)) std::fputs("\n", stderr);
        return absl::CancelledError(absl::StrCat("interrupted: ", results_path, " holds ", finished, " of ", total,
                                                 " runs; run the same command again to resume"));
      }
      if (!line.ok()) {
        return absl::Status(line.status().code(), absl::StrCat("point ", p.Key(), " repeat ", r, ": ", line.status().message()));
      }
      if (auto st = WriteFileSynced(results_path, line->dump() + "\n", true); !st.ok()) return st;
      ++finished;
      progress.Finished((*line)["elapsed_s"].get<double>(),
                        absl::StrFormat("%.0f out tok/s, P99 TPOT %.2f ms", (*line)["output_tok_s"].get<double>(),
                                        (*line)["tpot_ms"]["p99"].get<double>()));
    }
  }
  std::fprintf(stderr, "[experiment] done: %d runs in %s; report: specula experiment report %s\n", total,
               results_path.c_str(), opt.out_dir.c_str());
  return absl::OkStatus();
}

}  // namespace specula::experiments
