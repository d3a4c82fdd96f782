// Structured output through xgrammar's C++ core: a compiler per model (its vocabulary), a compiled
// constraint shared by every request that asks for the same one, and each sequence's matcher, which
// fills the step's token mask and follows the tokens chosen. No xgrammar type leaves constrain/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "constrain/limits.h"
#include "core/batch.h"
#include "core/constraint_spec.h"
#include "tokenizer/tokenizer.h"

namespace specula {

// What the grammar engine needs of a tokenizer: every token's bytes out of context (a SentencePiece
// piece's leading space included; empty for special tokens, which a grammar never allows), the
// vocabulary's kind, and the stop ids of the one stop rule (StopTokenIds).
struct ConstraintVocab {
  std::vector<std::string> token_bytes;  // [model vocab]: the model's rows past the tokenizer's are empty
  VocabKind kind = VocabKind::kRaw;
  std::vector<TokenId> stop_ids;
};
ConstraintVocab MakeConstraintVocab(const Tokenizer& tokenizer, int32_t model_vocab, std::vector<TokenId> stop_ids);

// 32-bit words of one row's mask: bit v of word v / 32 is set where token v may come next.
int32_t MaskWords(int32_t vocab);
// Sets logits[v] to -inf wherever the mask's bit v is clear. logits: [vocab]; mask: [MaskWords(vocab)].
void ApplyMask(absl::Span<const uint32_t> mask, absl::Span<float> logits);

class CompiledConstraint;  // opaque: xgrammar's compiled grammar

class ConstraintCompiler {
 public:
  static std::unique_ptr<ConstraintCompiler> Create(ConstraintVocab vocab, ConstraintLimits limits = {});
  ~ConstraintCompiler();

  // Checks the spec against the limits and the supported keywords (constrain/schema_check.h), then
  // compiles it on the calling thread (the compiler uses one thread; a repeated spec comes from the
  // cache). Thread-safe. Errors are InvalidArgument naming spec.field and the construct at fault.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Compile(const ConstraintSpec& spec) const;

  const ConstraintLimits& limits() const { return limits_; }
  int32_t vocab_size() const;
  const std::vector<TokenId>& stop_ids() const;
  int64_t cache_bytes() const;  // what the cache holds now

 private:
  struct Impl;
  ConstraintCompiler(std::unique_ptr<Impl> impl, ConstraintLimits limits);
  std::unique_ptr<Impl> impl_;
  ConstraintLimits limits_;
};

// One sequence's position in its constraint. Not thread-safe: the engine's loop owns it.
class ConstraintMatcher {
 public:
  // `stop_ids`: the request's stop set (StopTokenIds), the only tokens that may end it.
  ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled, const std::vector<TokenId>& stop_ids);
  ~ConstraintMatcher();
  ConstraintMatcher(ConstraintMatcher&&) noexcept;
  ConstraintMatcher& operator=(ConstraintMatcher&&) noexcept;

  // The tokens that may come next. mask: [MaskWords(vocab)].
  void FillMask(absl::Span<uint32_t> mask);
  // Follows a chosen token; false when the constraint does not allow it (the matcher is unchanged).
  bool Accept(TokenId token);
  // Whether a stop token ended the constraint, or it can take nothing more.
  bool terminated() const;
  // Undoes the last `n` accepted tokens.
  void Rollback(int32_t n);
  // Up to `max` tokens of the one continuation the constraint allows from here (a JSON key, a
  // closing brace): xgrammar's longest-match tokenization of it, which may split it differently
  // from the model, so that they are drafts to verify, never tokens to force. Empty once the
  // constraint could end here or has ended.
  std::vector<TokenId> ForcedTokens(int32_t max) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula
