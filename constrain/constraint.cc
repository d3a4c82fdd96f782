// The compiler, compiled constraints and matchers over xgrammar's C++ core. xgrammar's types and
// exceptions stay in this file: every call into it is inside a try, and its warnings (it ignores
// what it cannot enforce) become refusals.
#include "constrain/constraint.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "constrain/schema_check.h"
#include "constrain/xgrammar_log.h"
#include "nlohmann/json.hpp"

namespace specula {

class CompiledConstraint {
 public:
  explicit CompiledConstraint(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

ConstraintVocab MakeConstraintVocab(const Tokenizer& tokenizer, int32_t model_vocab, std::vector<TokenId> stop_ids) {
  ConstraintVocab v;
  v.token_bytes.resize(std::max(model_vocab, tokenizer.vocab_size()));
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) v.token_bytes[id] = tokenizer.TokenBytes(id);
  v.kind = tokenizer.vocab_kind();
  v.stop_ids = std::move(stop_ids);
  return v;
}

int32_t MaskWords(int32_t vocab) { return (vocab + 31) / 32; }

void ApplyMask(absl::Span<const uint32_t> mask, absl::Span<float> logits) {
  const float kMinusInf = -std::numeric_limits<float>::infinity();
  const size_t vocab = logits.size();
  for (size_t w = 0; w < mask.size(); ++w) {
    const size_t base = w * 32;
    const size_t end = std::min(vocab, base + 32);
    if (base >= end) break;
    uint32_t refused = ~mask[w];
    if (end - base < 32) refused &= (1u << (end - base)) - 1;
    if (refused == 0) continue;  // all 32 allowed: the common word while a string is open
    if (refused == ~0u) {        // none allowed: the common word once the grammar narrows
      std::fill(logits.begin() + base, logits.begin() + end, kMinusInf);
      continue;
    }
    for (; refused != 0; refused &= refused - 1) logits[base + __builtin_ctz(refused)] = kMinusInf;
  }
}

namespace {

// A choice list as a grammar: root ::= ("a" | "b" | ...), each literal JSON-escaped (xgrammar's
// string literals take the same escapes).
std::string ChoiceGrammar(const std::vector<std::string>& choices) {
  std::vector<std::string> literals;
  literals.reserve(choices.size());
  for (const std::string& c : choices) literals.push_back(nlohmann::json(c).dump(-1, ' ', true));
  return absl::StrCat("root ::= (", absl::StrJoin(literals, " | "), ")\n");
}

// A structural tag with the blanks of each JSON payload in it (a tool call's arguments) capped as a
// schema's are. The tag's depth is bounded by the check before this; a schema (a payload's
// "json_schema") is left as it is.
std::string CapTagWhitespace(const std::string& text, int32_t max_whitespace) {
  nlohmann::ordered_json tag = nlohmann::ordered_json::parse(text, nullptr, false);
  if (tag.is_discarded()) return text;  // xgrammar names the error
  std::vector<nlohmann::ordered_json*> stack = {&tag};
  while (!stack.empty()) {
    nlohmann::ordered_json* node = stack.back();
    stack.pop_back();
    if (node->is_array()) {
      for (auto& v : *node) stack.push_back(&v);
      continue;
    }
    if (!node->is_object()) continue;
    auto type = node->find("type");
    if (type != node->end() && *type == "json_schema" && !node->contains("max_whitespace_cnt")) {
      (*node)["max_whitespace_cnt"] = max_whitespace;
    }
    for (auto& [key, value] : node->items()) {
      if (key != "json_schema") stack.push_back(&value);
    }
  }
  return tag.dump();
}

// The key of a refusal found only by compiling (a warning), remembered because the cache would
// answer the same spec again without compiling, and so without the warning.
std::string SpecKey(const ConstraintSpec& spec) {
  return absl::StrCat(static_cast<int>(spec.kind), spec.compact_json ? "c:" : ":", spec.text, "\x1f", absl::StrJoin(spec.choices, "\x1f"));
}

constexpr size_t kMaxRememberedRefusals = 4096;

}  // namespace

struct ConstraintCompiler::Impl {
  Impl(const xgrammar::TokenizerInfo& info, int64_t cache_bytes)
      : compiler(info, /*max_threads=*/1, /*cache_enabled=*/true, cache_bytes) {}

  xgrammar::CompiledGrammar CompileChecked(const ConstraintSpec& spec, int32_t max_whitespace) {
    using Kind = ConstraintSpec::Kind;
    // Compact JSON: xgrammar's default separators without an indent, ", " and ": ".
    const bool any_whitespace = !spec.compact_json;
    const std::optional<int> whitespace = any_whitespace ? std::optional<int>(max_whitespace) : std::nullopt;
    switch (spec.kind) {
      case Kind::kJsonObject:
        return compiler.CompileJSONSchema(R"({"type": "object"})", any_whitespace, std::nullopt, std::nullopt, true,
                                          whitespace);
      case Kind::kJsonSchema:
        return compiler.CompileJSONSchema(spec.text, any_whitespace, std::nullopt, std::nullopt, true, whitespace);
      case Kind::kRegex: return compiler.CompileRegex(spec.text);
      case Kind::kChoice: return compiler.CompileGrammar(ChoiceGrammar(spec.choices), "root");
      case Kind::kGrammar: return compiler.CompileGrammar(spec.text, "root");
      case Kind::kStructuralTag: return compiler.CompileStructuralTag(CapTagWhitespace(spec.text, max_whitespace));
      case Kind::kNone: break;
    }
    throw std::invalid_argument("no constraint to compile");
  }

  xgrammar::GrammarCompiler compiler;
  std::vector<TokenId> stop_ids;
  int32_t vocab_size = 0;
  std::mutex mu;  // guards refused
  absl::flat_hash_map<std::string, std::string> refused;  // SpecKey -> the warning that refused it
};

std::unique_ptr<ConstraintCompiler> ConstraintCompiler::Create(ConstraintVocab vocab, ConstraintLimits limits) {
  const int32_t vocab_size = static_cast<int32_t>(vocab.token_bytes.size());
  // RAW: the bytes are already decoded out of context (MakeConstraintVocab), whatever the kind.
  xgrammar::TokenizerInfo info(vocab.token_bytes, xgrammar::VocabType::RAW, vocab_size, vocab.stop_ids,
                               /*add_prefix_space=*/false);
  auto impl = std::make_unique<Impl>(info, limits.cache_bytes);
  impl->stop_ids = std::move(vocab.stop_ids);
  impl->vocab_size = vocab_size;
  return std::unique_ptr<ConstraintCompiler>(new ConstraintCompiler(std::move(impl), limits));
}

ConstraintCompiler::ConstraintCompiler(std::unique_ptr<Impl> impl, ConstraintLimits limits)
    : impl_(std::move(impl)), limits_(limits) {}
ConstraintCompiler::~ConstraintCompiler() = default;

int32_t ConstraintCompiler::vocab_size() const { return impl_->vocab_size; }
const std::vector<TokenId>& ConstraintCompiler::stop_ids() const { return impl_->stop_ids; }
int64_t ConstraintCompiler::cache_bytes() const { return impl_->compiler.GetCacheSizeBytes(); }

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> ConstraintCompiler::Compile(const ConstraintSpec& spec) const {
  if (!spec.active()) return absl::InvalidArgumentError(absl::StrCat(spec.field, ": no constraint to compile"));
  if (absl::Status s = CheckConstraint(spec, limits_); !s.ok()) return s;
  const std::string key = SpecKey(spec);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (auto it = impl_->refused.find(key); it != impl_->refused.end()) {
      return absl::InvalidArgumentError(it->second);
    }
  }
  constrain::TakeXgrammarWarnings();  // what an earlier call on this thread left
  std::shared_ptr<const CompiledConstraint> compiled;
  try {
    compiled = std::make_shared<const CompiledConstraint>(impl_->CompileChecked(spec, limits_.max_whitespace));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(spec.field, ": ", e.what()));
  }
  std::vector<std::string> warnings = constrain::TakeXgrammarWarnings();
  if (warnings.empty()) return compiled;
  std::string message = absl::StrCat(spec.field, ": not supported: ", absl::StrJoin(warnings, "; "),
                                     " (the grammar engine would not enforce it)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->refused.size() >= kMaxRememberedRefusals) impl_->refused.clear();
  impl_->refused.emplace(key, message);
  return absl::InvalidArgumentError(message);
}

struct ConstraintMatcher::Impl {
  Impl(const xgrammar::CompiledGrammar& g, const std::vector<TokenId>& stop_ids)
      : matcher(g, std::vector<int>(stop_ids.begin(), stop_ids.end()), /*terminate_without_stop_token=*/false) {}
  xgrammar::GrammarMatcher matcher;
  std::shared_ptr<const CompiledConstraint> compiled;  // kept alive with the matcher
};

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled,
                                     const std::vector<TokenId>& stop_ids)
    : impl_(std::make_unique<Impl>(compiled->grammar, stop_ids)) {
  impl_->compiled = std::move(compiled);
}
ConstraintMatcher::~ConstraintMatcher() = default;
ConstraintMatcher::ConstraintMatcher(ConstraintMatcher&&) noexcept = default;
ConstraintMatcher& ConstraintMatcher::operator=(ConstraintMatcher&&) noexcept = default;

void ConstraintMatcher::FillMask(absl::Span<uint32_t> mask) {
  int64_t shape[1] = {static_cast<int64_t>(mask.size())};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  impl_->matcher.FillNextTokenBitmask(&t, 0);
}

bool ConstraintMatcher::Accept(TokenId token) { return impl_->matcher.AcceptToken(token); }
bool ConstraintMatcher::terminated() const { return impl_->matcher.IsTerminated(); }
void ConstraintMatcher::Rollback(int32_t n) { impl_->matcher.Rollback(n); }

std::vector<TokenId> ConstraintMatcher::ForcedTokens(int32_t max) const {
  if (max <= 0) return {};
  std::vector<int32_t> tokens;
  try {
    tokens = impl_->matcher.FindJumpForwardTokens();
  } catch (const std::exception&) {
    return {};  // no drafts: the mask still decides every token
  }
  if (static_cast<int32_t>(tokens.size()) > max) tokens.resize(max);
  return std::vector<TokenId>(tokens.begin(), tokens.end());
}

}  // namespace specula
