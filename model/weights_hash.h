// A hash of a model's weights: what keys KV blocks shared between replicas (another file's blocks
// must never be used) and what tells a reloaded model from the one it replaces. XXH3-64 over every
// byte of the model (a file; a directory's regular files in name order), computed once and kept in
// a cache keyed by the files' identity (path, size, modification time, inode), since a multi-GB
// model takes seconds to read.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace specula {

// 16 hex digits. `cache_dir` (empty: no cache) holds one small file per identity, written whole;
// one that does not parse or names another identity is ignored and replaced.
absl::StatusOr<std::string> WeightsHash(const std::string& model_path, const std::string& cache_dir);

// $SPECULA_WEIGHTS_HASH_CACHE, else $XDG_CACHE_HOME/specula/weights-hash, else
// ~/.cache/specula/weights-hash.
std::string DefaultWeightsHashCacheDir();

}  // namespace specula
