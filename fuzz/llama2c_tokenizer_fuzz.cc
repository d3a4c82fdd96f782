// llama2.c tokenizer.bin (tokenizer/llama2c_tokenizer.cc LoadLlama2cTokenizer): int32
// max_token_length, then per token a float32 score, an int32 length and the bytes. The file does
// not record its vocabulary size (the model's header does): the input's first 4 bytes are that
// vocab_size (little-endian int32, any value) and the rest is the file. An accepted tokenizer
// encodes a fixed text and decodes what it made.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/fuzz_util.h"
#include "fuzz/tokenizer_check.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr char kText[] = "Once upon a time, there was a little girl named Lily. été 🦙 \xff\xfe";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  int32_t vocab_size;
  std::memcpy(&vocab_size, data, 4);
  const std::string path = specula::fuzz::WriteScratch("tokenizer.bin", data + 4, size - 4);
  auto tok = specula::LoadLlama2cTokenizer(path, vocab_size);
  if (!tok.ok()) return 0;
  const specula::Tokenizer& t = **tok;
  specula::fuzz::ExerciseTokenizer(t, kText);
  specula::fuzz::DecodeEachToken(t);
  return 0;
}
