// gRPC Generate requests: the serialized specula.v1.GenerateRequest as the service receives it
// (serving/grpc_frontend.cc ParseGenerateRequest: protobuf parsing and the proto3 defaults), then
// the checks the server runs before admission (serving/server.cc ValidateServeRequest, with a
// Llama-3-style byte-level BPE tokenizer).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "serving/grpc_frontend.h"
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
  std::vector<specula::TokenId> prompt;
  if (specula::ValidateServeRequest(*r, tok, tok.vocab_size(), /*max_model_len=*/2048, /*add_bos=*/true, &prompt).ok()) {
    for (specula::TokenId t : prompt) {
      if (t < 0 || t >= tok.vocab_size()) __builtin_trap();  // admitted with a token outside the vocabulary
    }
  }
  return 0;
}
