// The JSON bodies of POST /v1/completions and /v1/chat/completions (serving/http_frontend.cc
// ParseHttpRequestBody: the shared fields, prompt strings and token-id lists, chat messages
// rendered with SmolLM2's chat template), then the checks the server runs before admission
// (serving/server.cc ValidateServeRequest, with a byte-level BPE tokenizer). The first byte picks
// the endpoint (odd: chat); the rest is the body. An admitted request's logprobs, samples, penalties
// and biases must be in range and go through the sampler's logit processing.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>

#include "chat/chat.h"
#include "chat/chat_template.h"
#include "fuzz/fuzz_util.h"
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
  std::vector<specula::TokenId> prompt;
  if (specula::ValidateServeRequest(parsed->request, *f.tokenizer, f.tokenizer->vocab_size(), /*max_model_len=*/2048,
                                    /*add_bos=*/true, &prompt)
          .ok()) {
    for (specula::TokenId t : prompt) {
      if (t < 0 || t >= f.tokenizer->vocab_size()) __builtin_trap();  // admitted with a token outside the vocabulary
    }
    // Admitted: logprobs, samples, penalties and biases are in range, and the sampler takes them.
    const specula::ServeRequest& r = parsed->request;
    if (r.logprobs < -1 || r.logprobs > specula::kMaxLogprobs || r.n < 1 || r.n > specula::kMaxSamples) __builtin_trap();
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
