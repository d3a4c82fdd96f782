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
  RequestContext context;
  context.vocab_size = vocab_size;
  context.has_tokenizer = has_tokenizer;
  if (absl::Status st = CheckRequest(Surface::kEngine, context, r.prompt, r); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", st.message()));
  }
  return absl::OkStatus();
}

Request MakeRequest(RequestId id, std::vector<TokenId> prompt, RequestSpec spec) {
  Request r;
  static_cast<RequestSpec&>(r) = std::move(spec);
  r.id = id;
  r.prompt = std::move(prompt);
  return r;
}

RequestContext ModelRequestContext(const Tokenizer* tokenizer, int32_t vocab_size, int32_t max_model_len) {
  RequestContext c;
  c.vocab_size = vocab_size;
  c.max_model_len = max_model_len;
  c.has_tokenizer = tokenizer != nullptr;
  if (tokenizer != nullptr) {
    c.encode = [tokenizer](std::string_view text, bool add_bos) { return tokenizer->Encode(text, add_bos); };
  }
  return c;
}

}  // namespace specula
