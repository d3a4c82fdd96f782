#include "constrain/forced_spellings.h"

#include <algorithm>

namespace specula {

std::vector<TokenId> ForcedSpellings::Spell(absl::Span<const TokenId> forced) const {
  if (tokenizer_ == nullptr || chosen_.empty()) return std::vector<TokenId>(forced.begin(), forced.end());
  std::string text;            // the bytes `forced` spells
  std::vector<size_t> starts;  // [forced]: where each of its tokens starts in text
  for (TokenId t : forced) {
    starts.push_back(text.size());
    text += tokenizer_->TokenBytes(t);
  }
  std::vector<TokenId> out;
  for (size_t at = 0; at < text.size();) {
    const std::string_view rest = std::string_view(text).substr(at);
    if (auto it = chosen_.find(std::string(Key(rest))); it != chosen_.end()) {
      const std::string bytes = tokenizer_->TokenBytes(it->second);
      if (!bytes.empty() && rest.substr(0, bytes.size()) == bytes) {
        out.push_back(it->second);
        at += bytes.size();
        continue;
      }
    }
    const auto split = std::lower_bound(starts.begin(), starts.end(), at);
    if (split == starts.end() || *split != at) break;
    const TokenId t = forced[split - starts.begin()];
    out.push_back(t);
    at += tokenizer_->TokenBytes(t).size();
  }
  return out;
}

void ForcedSpellings::Learn(absl::Span<const TokenId> forced, size_t at, TokenId chosen) {
  if (tokenizer_ == nullptr || at >= forced.size()) return;
  std::string rest;
  for (size_t i = at; i < forced.size(); ++i) rest += tokenizer_->TokenBytes(forced[i]);
  const std::string bytes = tokenizer_->TokenBytes(chosen);
  if (bytes.empty() || rest.compare(0, bytes.size(), bytes) != 0) return;  // not a split of the same string
  if (chosen_.size() >= max_entries_) chosen_.clear();
  chosen_[std::string(Key(rest))] = chosen;
}

}  // namespace specula
