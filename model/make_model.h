// Random-weight models of named real shapes ("dummy weights"), written as HF directories, so that
// speed work needs no downloads.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace specula {

std::vector<std::string> NamedShapes();
absl::StatusOr<ModelConfig> NamedShape(const std::string& name);

// Writes config.json, model.safetensors and a byte-level tokenizer.json into `dir`.
// Linear weights are uniform with std 1/sqrt(fan_in), embeddings std 0.1, norms near 1: no zeros.
absl::Status WriteRandomModel(const ModelConfig& config, const std::string& dir, DType dtype,
                              uint64_t seed);

}  // namespace specula
