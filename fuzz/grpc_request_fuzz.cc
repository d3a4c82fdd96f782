// gRPC Generate requests: the serialized specula.v1.GenerateRequest as the service receives it
// (serving/grpc_frontend.cc ParseGenerateRequest: protobuf parsing and the proto3 defaults), then
// what the server runs before admission (request/boundary.cc NormalizeRequest under the gRPC row,
// with a Llama-3-style byte-level BPE tokenizer). An admitted request's prompt is in the vocabulary
// and its max_tokens within the room the prompt leaves.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "serving/grpc_frontend.h"
#include "request/boundary.h"
#include "serving/server.h"
#include "tokenizer/tokenizer.h"

namespace {

const specula::Tokenizer& Tok() {
  static const specula::Tokenizer* tok = [] {
    // Protobuf logs each string field with invalid UTF-8 that it refuses: quiet, as gRPC is.
    google::protobuf::SetLogHandler(nullptr);
    const std::string path = specula::fuzz::SourcePath("tests/data/tokenizers/llama3_style/tokenizer.json");
    auto t = specula::LoadHfTokenizer(path);
    if (!t.ok()) specula::fuzz::SetupFailed(std::string(t.status().message()));
    return t->release();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const specula::Tokenizer& tok = Tok();
  auto r = specula::ParseGenerateRequest(std::string(reinterpret_cast<const char*>(data), size));
  if (!r.ok()) return 0;
  constexpr int32_t kMaxModelLen = 2048;
  const specula::RequestContext context =
      specula::ServeRequestContext(tok, tok.vocab_size(), kMaxModelLen, true, specula::kMaxTokensFlagDefault);
  specula::RequestSpec spec = *r;
  auto prompt = specula::NormalizeRequest(r->surface, context, specula::ServePrompt(*r), &spec);
  if (prompt.ok()) {
    for (specula::TokenId t : *prompt) {
      if (t < 0 || t >= tok.vocab_size()) __builtin_trap();  // admitted with a token outside the vocabulary
    }
    const int64_t room = kMaxModelLen - static_cast<int64_t>(prompt->size());
    if (spec.max_tokens < 1 || spec.max_tokens > room) __builtin_trap();  // past the context
  }
  return 0;
}
