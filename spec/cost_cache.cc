#include "spec/cost_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

constexpr char kFormat[] = "specula.step_cost.v1";
constexpr size_t kHashedBytes = 256 * 1024;

uint64_t Fnv1a(const std::string& bytes, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

// The first `limit` bytes of a file, or "" if it cannot be read.
std::string Head(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(limit, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(limit));
  bytes.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return bytes;
}

std::string StatString(const struct stat& st) {
  return absl::StrCat(st.st_size, " bytes, mtime ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

class FileCostStore final : public CostStore {
 public:
  FileCostStore(std::string path, nlohmann::json identity) : path_(std::move(path)), identity_(std::move(identity)) {
    std::ifstream in(path_);
    if (!in) return;
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("format", "") != kFormat || j.value("identity", nlohmann::json()) != identity_ ||
        !j.contains("tables") || !j["tables"].is_object()) {
      return;  // another format or a hash collision: start over
    }
    tables_ = j["tables"];
  }

  std::vector<CostPoint> Get(const std::string& table) const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CostPoint> points;
    if (!tables_.contains(table) || !tables_[table].is_array()) return points;
    for (const nlohmann::json& p : tables_[table]) {
      if (!p.is_object() || !p.value("flops", nlohmann::json()).is_number() ||
          !p.value("seconds", nlohmann::json()).is_number() || !p.value("tokens", nlohmann::json()).is_number()) {
        return {};
      }
      const CostPoint c{p["flops"].get<double>(), p["seconds"].get<double>(), p["tokens"].get<int32_t>()};
      if (!(c.flops > 0) || !(c.seconds > 0) || c.tokens < 1) return {};  // a table out of order is none
      if (!points.empty() && (c.tokens <= points.back().tokens || c.flops <= points.back().flops)) return {};
      points.push_back(c);
    }
    return points;
  }

  void Put(const std::string& table, const std::vector<CostPoint>& points) override {
    std::lock_guard<std::mutex> lock(mu_);
    nlohmann::json rows = nlohmann::json::array();
    for (const CostPoint& p : points) rows.push_back({{"tokens", p.tokens}, {"flops", p.flops}, {"seconds", p.seconds}});
    tables_[table] = rows;
    const nlohmann::json j = {{"format", kFormat}, {"identity", identity_}, {"tables", tables_}};
    // Written beside and renamed: a reader never sees half a file, and processes racing keep one whole.
    const std::string tmp = absl::StrCat(path_, ".", ::getpid(), ".tmp");
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    out.close();
    if (!out || std::rename(tmp.c_str(), path_.c_str()) != 0) {
      std::remove(tmp.c_str());
      if (!warned_) std::fprintf(stderr, "[specula] cannot write the step-cost cache %s\n", path_.c_str());
      warned_ = true;
    }
  }

 private:
  const std::string path_;
  const nlohmann::json identity_;
  mutable std::mutex mu_;
  nlohmann::json tables_ = nlohmann::json::object();
  bool warned_ = false;
};

absl::Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string part = dir.substr(0, i);
    struct stat st;
    if (::stat(part.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(part, " is not a directory"));
    } else if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create ", part, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostIdentity> ModelFileIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  CostIdentity id{{"model", path}};
  if (S_ISDIR(st.st_mode)) {  // HF: config.json, and each safetensors file's size, time and header
    std::string hashed = Head(path + "/config.json", kHashedBytes);
    for (const char* name : {"/model.safetensors", "/model.safetensors.index.json"}) {
      struct stat f;
      if (::stat((path + name).c_str(), &f) == 0) hashed += StatString(f) + Head(path + name, 64 * 1024);
    }
    id["model_file"] = StatString(st);
    id["model_header_fnv1a"] = Hex(Fnv1a(hashed));
  } else {
    id["model_file"] = StatString(st);
    id["model_header_fnv1a"] = Hex(Fnv1a(Head(path, kHashedBytes)));
  }
  return id;
}

CostIdentity MachineIdentity() {
  std::string cpu = "unknown";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string threads = omp != nullptr && *omp != '\0' ? omp : std::to_string(std::thread::hardware_concurrency());
  std::string build = "unknown";
  struct stat st;
  if (::stat("/proc/self/exe", &st) == 0) build = StatString(st);
  return {{"cpu", cpu}, {"threads", threads}, {"build", build}};
}

std::string DefaultCostCacheDir() {
  if (const char* env = std::getenv("SPECULA_COST_CACHE"); env != nullptr && *env != '\0') return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/specula/step-cost");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.cache/specula/step-cost");
}

absl::StatusOr<std::shared_ptr<CostStore>> OpenCostCache(const std::string& dir, const CostIdentity& identity) {
  if (auto s = MakeDirs(dir); !s.ok()) return absl::Status(s.code(), absl::StrCat("--cost-cache: ", s.message()));
  const nlohmann::json j(identity);
  const std::string path = absl::StrCat(dir, "/step-cost-", Hex(Fnv1a(j.dump())), ".json");
  return std::shared_ptr<CostStore>(std::make_shared<FileCostStore>(path, j));
}

}  // namespace specula
