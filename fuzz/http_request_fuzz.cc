// The JSON bodies of POST /v1/completions and /v1/chat/completions (serving/http_frontend.cc
// ParseHttpRequestBody: the shared fields, prompt strings and token-id lists, chat messages
// rendered with SmolLM2's chat template), then what the server runs before admission
// (request/boundary.cc NormalizeRequest under the endpoint's row, with a byte-level BPE tokenizer).
// The first byte picks the endpoint (odd: chat); the rest is the body. An admitted request's
// logprobs and samples must be within its row's bounds, its max_tokens within the room the prompt
// leaves, and its penalties and biases go through the sampler's logit processing.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "chat/chat.h"
#include "chat/chat_template.h"
#include "fuzz/fuzz_util.h"
#include "request/boundary.h"
#include "serving/openai_api.h"
#include "serving/server.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Fixture {
  std::unique_ptr<specula::Tokenizer> tokenizer;
  absl::StatusOr<specula::ChatSource> chat_source;
  std::optional<specula::ChatTemplate> chat_template;
};

const Fixture& Fix() {
  static const Fixture* fix = [] {
    namespace fz = specula::fuzz;
    auto* f = new Fixture;
    auto tok = specula::LoadHfTokenizer(fz::SourcePath("tests/data/tokenizers/smollm_style/tokenizer.json"));
    if (!tok.ok()) fz::SetupFailed(std::string(tok.status().message()));
    f->tokenizer = *std::move(tok);
    auto text = specula::ReadTextFile(fz::SourcePath("tests/data/chat_templates/smollm2.jinja"));
    if (!text.ok()) fz::SetupFailed(std::string(text.status().message()));
    f->chat_source = specula::ChatSource{*text, "<|im_start|>", "<|im_end|>", "smollm2.jinja"};
    auto t = specula::ChatTemplate::Parse(*text);
    if (!t.ok()) fz::SetupFailed(std::string(t.status().message()));
    f->chat_template = *std::move(t);
    f->chat_template->set_fixed_time(0);
    return f;
  }();
  return *fix;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Fixture& f = Fix();
  const bool chat = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parsed = specula::ParseHttpRequestBody(body, chat, "model", &*f.chat_template, f.chat_source);
  if (!parsed.ok()) return 0;
  constexpr int32_t kMaxModelLen = 2048;
  const specula::RequestContext context = specula::ServeRequestContext(
      *f.tokenizer, f.tokenizer->vocab_size(), kMaxModelLen, true, specula::kMaxTokensFlagDefault);
  const specula::ServeRequest& parsed_request = parsed->request;
  specula::RequestSpec r = parsed_request;
  auto admitted = specula::NormalizeRequest(parsed_request.surface, context, specula::ServePrompt(parsed_request), &r);
  if (admitted.ok()) {
    const std::vector<specula::TokenId>& prompt = *admitted;
    for (specula::TokenId t : prompt) {
      if (t < 0 || t >= f.tokenizer->vocab_size()) __builtin_trap();  // admitted with a token outside the vocabulary
    }
    // Admitted: logprobs, samples and length in the row's bounds, penalties and biases in range, and
    // the sampler takes them.
    const specula::SurfaceRules& rules = specula::RulesOf(parsed_request.surface);
    if (r.logprobs < -1 || r.logprobs > rules.max_logprobs || r.n < 1 || r.n > rules.max_n) __builtin_trap();
    const int64_t room = kMaxModelLen - static_cast<int64_t>(prompt.size());
    if (r.max_tokens < 1 || r.max_tokens > room) __builtin_trap();  // past the context
    specula::SamplingParams p = r.sampling;
    p.output_start = static_cast<int32_t>(prompt.size() / 2);  // the second half counts as generated
    std::vector<float> logits(f.tokenizer->vocab_size(), 0.5f);  // [vocab]
    specula::ProcessLogits(p, prompt, &logits);
    const float bound = 101.0f + 2.0f * static_cast<float>(prompt.size() + 1);  // bias 100; 2 per counted token
    for (float v : logits) {
      if (!(v >= -bound && v <= bound)) __builtin_trap();
    }
  }
  return 0;
}
