// The small JSON files of an HF model directory: config.json (model/model_config.cc ParseHfConfig,
// then the sizes a loader derives from it) and tokenizer_config.json (BOS/EOS and add_bos_token in
// tokenizer/hf_tokenizer.cc, chat_template in chat/chat.cc). The input is both files at once.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "chat/chat.h"
#include "fuzz/fuzz_util.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace {

// A small sentencepiece-style tokenizer.json with the special tokens the seeds name (<unk>, <s>,
// </s>, <|im_start|>, <|im_end|>, <|begin_of_text|>, <|eot_id|>), beside which the input is written
// as tokenizer_config.json.
constexpr char kTokenizer[] = R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
  "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "H": 4, "e": 5, "l": 6, "o": 7, "w": 8, "r": 9, "d": 10,
            "He": 11, "ll": 12, "Hell": 13, "Hello": 14, "▁w": 15},
  "merges": ["H e", "l l", "He ll", "Hell o", "▁ w"]},
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
                   {"id": 2, "content": "</s>", "special": true}, {"id": 16, "content": "<|im_start|>", "special": true},
                   {"id": 17, "content": "<|im_end|>", "special": true},
                   {"id": 18, "content": "<|begin_of_text|>", "special": true},
                   {"id": 19, "content": "<|eot_id|>", "special": true}],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                 {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}})";

const std::string& Dir() {
  static const std::string* dir = [] {
    namespace fz = specula::fuzz;
    auto* d = new std::string(fz::ScratchDir() + "/hf");
    std::filesystem::create_directories(*d);
    fz::WriteFile(*d + "/tokenizer.json", kTokenizer);
    return d;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto c = specula::ParseHfConfig(text, "config.json"); c.ok()) {
    // What the loaders and the model compute from an accepted config before any tensor is read.
    volatile int64_t sink = c->q_dim() + c->kv_dim() + c->NumParams();
    (void)sink;
  }
  const std::string& dir = Dir();
  specula::fuzz::WriteFile(dir + "/tokenizer_config.json", text);
  if (auto tok = specula::LoadHfTokenizer(dir + "/tokenizer.json"); tok.ok()) {
    (void)(*tok)->Encode("Hello world", (*tok)->add_bos_default());
  }
  (void)specula::FindChatTemplate(dir);
  return 0;
}
