// The TinyStories target (models/tinystories) on the CPU backend with its tokenizer, for the tests
// that serve or step a real model: loaded once per test program and kept for its life.
#pragma once

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama_model.h"
#include "model/weights.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula::testing {

// {model, tokenizer}; each null (with a test failure) when it does not load.
inline std::pair<LlamaModel*, Tokenizer*> TinyStoriesTarget() {
  static const std::pair<LlamaModel*, Tokenizer*> loaded = [] {
    const std::string dir = TinyStoriesDir();
    std::pair<LlamaModel*, Tokenizer*> p{nullptr, nullptr};
    auto w = LoadModel(dir + "/stories260K.bin");
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) p.first = new LlamaModel(std::move(w).value(), MakeCpuBackend());
    auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
    EXPECT_TRUE(tok.ok()) << tok.status();
    if (tok.ok()) p.second = tok->release();
    return p;
  }();
  return loaded;
}

}  // namespace specula::testing
