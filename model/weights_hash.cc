#include "model/weights_hash.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/mapped_file.h"
#include "xxhash.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

// The files that make up the model, in a fixed order.
absl::StatusOr<std::vector<std::string>> ModelFiles(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::vector<std::string>{path};
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.is_regular_file(ec)) files.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::string> Identity(const std::vector<std::string>& files) {
  std::string id;
  for (const std::string& f : files) {
    struct stat st;
    if (::stat(f.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(f, ": cannot stat"));
    absl::StrAppend(&id, f, " ", st.st_size, " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, " ", st.st_ino, "\n");
  }
  return id;
}

absl::StatusOr<std::string> HashFiles(const std::vector<std::string>& files) {
  XXH64_hash_t h = 0;
  for (const std::string& f : files) {
    absl::StatusOr<MappedFile> m = MappedFile::Open(f);
    if (!m.ok()) return m.status();
    h = XXH3_64bits_withSeed(m->data(), m->size(), h);
  }
  return absl::StrFormat("%016x", h);
}

std::string CachePath(const std::string& dir, const std::string& identity) {
  return absl::StrFormat("%s/weights-%016x.txt", dir, XXH3_64bits(identity.data(), identity.size()));
}

// The cached hash when the file holds this identity: its first line the hash, the rest the identity.
std::string ReadCached(const std::string& file, const std::string& identity) {
  std::ifstream in(file);
  std::string hash;
  if (!std::getline(in, hash) || hash.size() != 16) return "";
  std::stringstream rest;
  rest << in.rdbuf();
  return rest.str() == identity ? hash : "";
}

void WriteCached(const std::string& dir, const std::string& file, const std::string& identity,
                 const std::string& hash) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string tmp = absl::StrCat(file, ".tmp", ::getpid());
  {
    std::ofstream out(tmp);
    out << hash << "\n" << identity;
    if (!out) return;
  }
  fs::rename(tmp, file, ec);  // whole or not at all: a cache that fails to write is only slower
}

}  // namespace

absl::StatusOr<std::string> WeightsHash(const std::string& model_path, const std::string& cache_dir) {
  absl::StatusOr<std::vector<std::string>> files = ModelFiles(model_path);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::string> identity = Identity(*files);
  if (!identity.ok()) return identity.status();
  const std::string cache = cache_dir.empty() ? "" : CachePath(cache_dir, *identity);
  if (!cache.empty()) {
    if (std::string hit = ReadCached(cache, *identity); !hit.empty()) return hit;
  }
  absl::StatusOr<std::string> hash = HashFiles(*files);
  if (hash.ok() && !cache.empty()) WriteCached(cache_dir, cache, *identity, *hash);
  return hash;
}

std::string DefaultWeightsHashCacheDir() {
  if (const char* env = std::getenv("SPECULA_WEIGHTS_HASH_CACHE"); env != nullptr && *env != '\0') return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/specula/weights-hash");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.cache/specula/weights-hash");
}

}  // namespace specula
