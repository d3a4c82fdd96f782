// Tokenizers: llama2.c `tokenizer.bin` and HF `tokenizer.json` (BPE, in its byte-level form as in
// Llama 3 / Qwen2 / SmolLM / GPT-2, and its sentencepiece-style form as in Llama 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/batch.h"

namespace specula {

// How a tokenizer's pieces map to bytes: as they are, SentencePiece with <0xNN> byte pieces, or
// GPT-2's byte-to-unicode table (what xgrammar's TokenizerInfo calls the vocabulary type).
enum class VocabKind : uint8_t { kRaw, kByteFallback, kByteLevel };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`. BOS is prepended when `add_bos` and the tokenizer has one.
  virtual std::vector<TokenId> Encode(std::string_view text, bool add_bos) const = 0;
  // The bytes `id` adds to the text when it follows `prev` (-1 at the start). Special tokens
  // decode to nothing. Bytes may be partial UTF-8; concatenation restores the text.
  virtual std::string DecodeToken(TokenId prev, TokenId id) const = 0;
  virtual int32_t vocab_size() const = 0;
  // The bytes of `id` out of context: as DecodeToken after an ordinary token (a SentencePiece
  // piece's leading space kept). Empty for special tokens.
  virtual std::string TokenBytes(TokenId id) const = 0;
  virtual VocabKind vocab_kind() const = 0;

  std::string Decode(absl::Span<const TokenId> ids) const;
  TokenId bos_id() const { return bos_id_; }
  const std::vector<TokenId>& eos_ids() const { return eos_ids_; }
  // Whether prompts get BOS by default (tokenizer_config.json / post_processor).
  bool add_bos_default() const { return add_bos_default_; }

 protected:
  TokenId bos_id_ = -1;
  std::vector<TokenId> eos_ids_;
  bool add_bos_default_ = true;
};

// llama2.c tokenizer.bin: int32 max_token_length, then per token float32 score, int32 len, bytes.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                                int32_t vocab_size);

// HF tokenizer.json; tokenizer_config.json beside it is read when present.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& json_path);

// The vocabulary embedded in a GGUF file (tokenizer.ggml.*): the gpt2 byte-level BPE with merges
// and its `pre` type, or the llama SPM with scores; BOS, EOS and added tokens (tokenizer/gguf_tokenizer.cc).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& gguf_path);

// `path` is a tokenizer.bin, a tokenizer.json, a .gguf file, or a directory holding tokenizer.json.
// `vocab_size` is the model's (llama2.c files do not record it).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path,
                                                         int32_t vocab_size);

}  // namespace specula
