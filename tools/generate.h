// `specula generate`: text from a model, one prompt or a prompts file.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "core/batch.h"
#include "engine/engine_setup.h"

namespace specula {

// `specula generate FLAGS` (argv without the command).
absl::Status RunGenerate(int argc, char** argv);

// One prompt through a one-sequence engine: its text streamed to stdout as it comes, or with
// `json` one JSON line at the end; statistics on stderr.
absl::Status RunSinglePrompt(LoadedEngine& e, std::vector<TokenId> prompt, bool json);

}  // namespace specula
