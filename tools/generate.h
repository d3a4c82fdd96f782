// `specula generate`: text from a model, one prompt or a prompts file.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "core/batch.h"
#include "engine/engine_setup.h"

namespace specula {

// `specula generate FLAGS` (argv without the command).
absl::Status RunGenerate(int argc, char** argv);

// One prompt (text; `templated`: a rendered chat template, which writes its own BOS), normalized
// under the table's one-prompt row, through a one-sequence engine: its text streamed to stdout as
// it comes, or with `json` one JSON line at the end; statistics on stderr.
absl::Status RunSinglePrompt(LoadedEngine& e, const std::string& text, bool templated, bool json);

}  // namespace specula
