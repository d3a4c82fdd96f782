// HF tokenizer.json (tokenizer/hf_tokenizer.cc): model.vocab, model.merges, added_tokens, the
// normalizer and pre_tokenizer steps and the post_processor; an accepted tokenizer then encodes
// a fixed text (every pre-tokenizer step and the BPE merge loop run) and decodes what it made.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "fuzz/tokenizer_check.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr char kText[] = "Hello, world!  It's 2024: 12345 tokens\n\tof été, ▁x, 日本語 🦙 <s></s><unk>\xe2\x96";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = specula::fuzz::WriteScratch("tokenizer.json", data, size);
  auto tok = specula::LoadHfTokenizer(path);
  if (!tok.ok()) return 0;
  const specula::Tokenizer& t = **tok;
  specula::fuzz::ExerciseTokenizer(t, kText);
  (void)t.Encode("", true);
  specula::fuzz::DecodeEachToken(t);
  return 0;
}
