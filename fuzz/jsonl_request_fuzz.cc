// JSONL request files: `specula generate --prompts-file` (tools/batch_generate.cc
// ParsePromptLine, each line split and skipped as RunBatchGenerate does, normalized under the
// table's prompts-file row with the TinyStories tokenizer and context) and the load generator's
// datasets (serving/load_gen.cc LoadJsonlDataset: bench-serve --dataset and experiment specs'
// prompts_file). An accepted line's prompt is in the vocabulary and shorter than the context, its
// max_tokens within the row's bound.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "serving/load_gen.h"
#include "request/boundary.h"
#include "tokenizer/tokenizer.h"
#include "tools/batch_generate.h"

namespace {

const specula::Tokenizer& Tok() {
  static const specula::Tokenizer* tok = [] {
    const std::string path = specula::fuzz::TinyStoriesDir() + "/tok512.bin";
    auto t = specula::LoadTokenizer(path, 512);
    if (!t.ok()) specula::fuzz::SetupFailed(std::string(t.status().message()));
    return t->release();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const specula::Tokenizer& tok = Tok();
  const std::string text(reinterpret_cast<const char*>(data), size);
  constexpr int32_t kContext = 512;  // stories260K's
  specula::PromptLineContext context;
  context.request = specula::ModelRequestContext(&tok, tok.vocab_size(), kContext);
  int32_t number = 0;
  for (size_t begin = 0; begin <= text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    nlohmann::json id;
    specula::Request request;
    const std::string error = specula::ParsePromptLine(line, number, context, &id, &request);
    if (error.empty()) {
      for (specula::TokenId t : request.prompt) {
        if (t < 0 || t >= tok.vocab_size()) __builtin_trap();  // a prompt token outside the vocabulary
      }
      if (request.prompt.size() >= static_cast<size_t>(kContext)) __builtin_trap();  // no room left
      const specula::SurfaceRules& rules = specula::RulesOf(specula::Surface::kPromptsFile);
      if (request.max_tokens < 1 || request.max_tokens > rules.max_max_tokens) __builtin_trap();
      (void)id.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // as the output line writes it
    }
  }
  const std::string path = specula::fuzz::WriteScratch("prompts.jsonl", data, size);
  (void)specula::LoadJsonlDataset(path, 16);
  return 0;
}
