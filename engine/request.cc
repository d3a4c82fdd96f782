#include "engine/request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specula {

std::vector<TokenId> StopTokenIds(const Request& r, const ModelConfig& model, const Tokenizer* tokenizer) {
  std::vector<TokenId> ids = r.stop_ids;
  if (!r.ignore_eos) {
    if (tokenizer != nullptr) ids.insert(ids.end(), tokenizer->eos_ids().begin(), tokenizer->eos_ids().end());
    ids.insert(ids.end(), model.eos_token_ids.begin(), model.eos_token_ids.end());
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

absl::Status ValidateRequest(const Request& r, int32_t vocab_size, bool has_tokenizer) {
  if (auto st = ValidateSamplingParams(r.sampling); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", st.message()));
  }
  for (TokenId t : r.prompt) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": token id ", t, " outside the vocabulary"));
    }
  }
  for (auto [id, bias] : r.sampling.logit_bias) {
    if (id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": logit_bias: token id ", id, " outside the vocabulary"));
    }
  }
  for (auto [name, n] : {std::pair<const char*, int32_t>{"logprobs", r.logprobs}, {"prompt_logprobs", r.prompt_logprobs}}) {
    if (n < -1 || n > vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", name, " must be in [-1, ", vocab_size, "], got ", n));
    }
  }
  if (!r.stop_strings.empty() && !has_tokenizer) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": stop strings need a tokenizer"));
  }
  return absl::OkStatus();
}

}  // namespace specula
