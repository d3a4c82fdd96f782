// Models for the benchmarks: the real TinyStories files, and random-weight models written once to
// $TMPDIR/specula_bench/NAME and reused by later runs.
#pragma once

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "model/make_model.h"
#include "tests/test_util.h"

namespace specula::bench {

// FILE in the tests' TinyStories folder (testing::TinyStoriesDir).
inline std::string TinyStories(const std::string& file) { return absl::StrCat(testing::TinyStoriesDir(), "/", file); }

// The directory of a random model with config `c`; written on first use. Aborts if it cannot be.
inline std::string RandomModel(const std::string& name, const ModelConfig& c, DType dtype, uint64_t seed) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/specula_bench");
  const std::string path = dir + "/" + name;
  struct stat st;
  if (::stat((path + "/model.safetensors").c_str(), &st) != 0) {
    ::mkdir(dir.c_str(), 0755);
    std::fprintf(stderr, "writing %s (%.2fB parameters)...\n", path.c_str(), c.NumParams() / 1e9);
    if (!WriteRandomModel(c, path, dtype, seed).ok()) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::abort();
    }
  }
  return path;
}

}  // namespace specula::bench
