// Measured step-cost tables kept across processes: one JSON file per model, machine and build in a
// cache directory, so that a second run of the same model on the same machine starts with the
// tables the first one measured (adaptive speculation then measures only shapes not yet there, and
// refines the tables online from its own steps as before). The format is documented in
// docs/architecture.md ("The step-cost cache"); the simulator and the GPU backend read the same.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/forward_work.h"

namespace specula {

// What the tables depend on, by name: the model file, the machine, the build, the backend's options.
using CostIdentity = std::map<std::string, std::string>;

// A model file or directory, cheaply: its path, size and modification time, and a hash of its first
// 256 KiB (a GGUF file's header and metadata; an HF directory's config.json and safetensors header),
// never of all its bytes. Errors: the path cannot be read.
absl::StatusOr<CostIdentity> ModelFileIdentity(const std::string& path);

// This machine and build: the CPU's model name, the threads (OMP_NUM_THREADS, else the CPUs), and the
// running executable's size and modification time (a rebuilt engine measures again).
CostIdentity MachineIdentity();

// $SPECULA_COST_CACHE, else $XDG_CACHE_HOME/specula/step-cost, else ~/.cache/specula/step-cost.
std::string DefaultCostCacheDir();

// The store of `identity`'s tables in `dir` (created if missing): the file
// step-cost-<hash of identity>.json. A file that does not parse, or holds another identity, is
// treated as empty and replaced by the next Put; a Put that cannot write is logged once, never an
// error (the tables are then measured again next time). Errors: `dir` cannot be created.
absl::StatusOr<std::shared_ptr<CostStore>> OpenCostCache(const std::string& dir, const CostIdentity& identity);

}  // namespace specula
