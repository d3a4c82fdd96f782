// The engine's flags, shared by `generate` and `serve`: their names, their --help text, and the
// EngineOptions (engine/options.h) they describe.
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "core/flags.h"
#include "engine/options.h"

namespace specula {

extern const std::set<std::string> kEngineFlags;
extern const std::set<std::string> kEngineSwitches;  // --ignore-eos, --no-bos, --no-prefix-caching, ...
extern const char kEngineFlagsHelp[];
// The heading of the request table (request/boundary.h's SurfaceTableMarkdown) in --help.
extern const char kRequestTableHelp[];

// Errors name the flag and its value: a number that does not parse, a flag that applies to
// another --spec-method, and everything ValidateEngineOptions refuses.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags(const Flags& flags);

}  // namespace specula
