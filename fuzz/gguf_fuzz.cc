// GGUF files (core/gguf.cc GgufFile::Open): the header, every metadata key/value (scalars,
// strings, arrays), the tensor directory and the data offsets; then what is read from them: the
// embedded tokenizer (tokenizer/gguf_tokenizer.cc) encoding and decoding a fixed text, the chat
// template and its special tokens (chat/chat.cc), and the model's config and tensors
// (model/gguf_loader.cc).
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/chat.h"
#include "core/gguf.h"
#include "fuzz/fuzz_util.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr char kText[] = "Hello, world! <|im_start|>user\n 123 été 🦙\t\t  x\xff";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = specula::fuzz::WriteScratch("model.gguf", data, size);
  auto f = specula::GgufFile::Open(path);
  if (!f.ok()) return 0;
  // Every typed getter on every key: each must answer a value or an error, whatever the type.
  for (const auto& [key, value] : f->metadata()) {
    (void)f->GetString(key);
    (void)f->GetInt(key);
    (void)f->GetFloat(key);
    (void)f->GetIntArray(key);
    (void)f->GetFloatArray(key);
    (void)f->GetStringArray(key);
  }
  volatile uint8_t sink = 0;
  for (const specula::GgufTensor& t : f->tensors()) {
    if (t.bytes > 0) sink = sink + t.data[0] + t.data[t.bytes - 1];
  }
  if (auto tok = specula::LoadGgufTokenizer(path); tok.ok()) {
    const std::vector<specula::TokenId> ids = (*tok)->Encode(kText, true);
    for (specula::TokenId id : ids) {
      if (id < 0 || id >= (*tok)->vocab_size()) __builtin_trap();  // Encode made an id outside the vocabulary
    }
    (void)(*tok)->Decode(ids);
    for (specula::TokenId id = -1; id <= (*tok)->vocab_size() && id < 300; ++id) (void)(*tok)->DecodeToken(id - 1, id);
  }
  (void)specula::FindChatTemplate(path);
  (void)specula::LoadGguf(path);
  return 0;
}
