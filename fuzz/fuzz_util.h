// Helpers for the libFuzzer targets (fuzz/*_fuzz.cc): a per-process scratch directory for parsers
// that read files, and the paths of the fixtures the targets load once at start.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "tests/test_util.h"

namespace specula::fuzz {

// A directory of this process's own, removed at exit: in /dev/shm where there is one (a file
// rewritten at every execution stays off the disk), else $TMPDIR or /tmp. Parsers that take a path
// get the fuzz input written into a file here.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    if (::access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    std::string tmpl = base + "/specula_fuzz_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    auto* d = new std::string(tmpl);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return d;
  }();
  return *dir;
}

// Writes `bytes` to `path` (created or truncated); aborts if it cannot, which is not the parser's fault.
inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())) {
    std::perror(path.c_str());
    std::abort();
  }
  std::fclose(f);
}

// `name` in the scratch directory, holding `data`.
inline std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/" + name;
  WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  return path;
}

// A file of this source tree (tests/data/...).
inline std::string SourcePath(const std::string& rel) { return std::string(SPECULA_SOURCE_DIR) + "/" + rel; }

// The TinyStories models, where the tests find them.
using ::specula::testing::TinyStoriesDir;

inline bool Exists(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

// Aborts with `what` when a fixture the target needs does not load: a broken setup, not a finding.
[[noreturn]] inline void SetupFailed(const std::string& what) {
  std::fprintf(stderr, "fuzz target setup failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace specula::fuzz
