// How the model spells the strings a grammar forces. The grammar's forced tokens are a longest-match
// split of its one allowed continuation (ConstraintMatcher::ForcedTokens), which the model often
// splits otherwise ("need" "s" where the split says "needs", '"' then ',' where it says '",').
// Where a forced draft was refused, the token the model chose there is remembered for the rest of
// that string, and later forced drafts of the same string follow the model's split. Engine-wide (a
// schema's keys recur across requests), bounded, used by the engine's loop only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "tokenizer/tokenizer.h"

namespace specula {

class ForcedSpellings {
 public:
  // `tokenizer` (null: nothing is learned or re-spelled) must outlive it.
  explicit ForcedSpellings(const Tokenizer* tokenizer, size_t max_entries = 1 << 14)
      : tokenizer_(tokenizer), max_entries_(max_entries) {}

  // `forced` spelled as the model was seen to: at each byte of the string it spells, a remembered
  // token if one spells what follows, else the split's own token starting there; where neither
  // does (the middle of a split token), the drafts end. The same bytes, or a prefix of them.
  std::vector<TokenId> Spell(absl::Span<const TokenId> forced) const;
  // Forced drafts `forced` were refused at `at` (< forced.size()), where the model chose `chosen`:
  // remembered when `chosen` spells a beginning of the rest of the string.
  void Learn(absl::Span<const TokenId> forced, size_t at, TokenId chosen);
  size_t size() const { return chosen_.size(); }

 private:
  // What a choice is remembered by: the first bytes of the rest of the forced string.
  static std::string_view Key(std::string_view rest) { return rest.substr(0, 32); }

  const Tokenizer* tokenizer_;
  const size_t max_entries_;
  absl::flat_hash_map<std::string, TokenId> chosen_;  // Key(rest) -> the model's token there
};

}  // namespace specula
