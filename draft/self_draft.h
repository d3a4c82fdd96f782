// Drafts made of the target itself, so that no second model is needed (--spec-method layer-skip
// and self-quant). Both are ordinary draft models for DraftModelProposer: the first N layers, or
// the weights requantized; the verifier keeps the output the target's, whatever they propose.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/quant.h"
#include "model/weights.h"

namespace specula {

// The target's first `num_layers` layers with its final norm and classifier. The target's file is
// mapped a second time: the pages are shared, so GGUF blocks and float32 files cost no memory
// (a backend that packs float32 matrices copies those N layers). The draft keeps its own KV for
// its N layers (N / L of the target's per token; measured in the README).
absl::StatusOr<std::unique_ptr<ModelWeights>> LayerSkipDraftWeights(const std::string& target_path,
                                                                    int32_t num_layers);

// The target's weight matrices requantized to `type` (Q8_0, Q4_0 or Q4_1) block by block, from
// their own values (blocks of another type are dequantized first). A matrix whose rows are not a
// multiple of 32 values stays as it is. Norms and biases are shared.
absl::StatusOr<std::unique_ptr<ModelWeights>> SelfQuantDraftWeights(const std::string& target_path, QuantType type);

}  // namespace specula
