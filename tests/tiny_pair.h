// The tiny random pair of the lossless tests: a 12-token target and a one-layer draft of its shape
// with other weights (so q != p), written once per call to temporary directories.
#pragma once

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "model/make_model.h"
#include "tests/test_util.h"

namespace specula::testing {

// {target dir, draft dir}.
inline std::pair<std::string, std::string> WriteTinyPair() {
  ModelConfig tc = *NamedShape("tiny");
  tc.vocab_size = 12;
  ModelConfig dc = tc;
  dc.num_layers = 1;
  const std::string td = MakeTempDir(), dd = MakeTempDir();
  EXPECT_TRUE(WriteRandomModel(tc, td, DType::kF32, 1).ok());
  EXPECT_TRUE(WriteRandomModel(dc, dd, DType::kF32, 2).ok());
  return {td, dd};
}

}  // namespace specula::testing
