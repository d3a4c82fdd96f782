#include "draft/suffix_index.h"

#include <algorithm>

namespace specula {

int32_t SuffixIndex::Add(absl::Span<const TokenId> tokens) {
  int32_t seq;
  if (free_.empty()) {
    seq = static_cast<int32_t>(seqs_.size());
    seqs_.emplace_back();
  } else {
    seq = free_.back();
    free_.pop_back();
  }
  seqs_[seq].tokens.assign(tokens.begin(), tokens.end());
  IndexTokens(seq, 0);
  return seq;
}

void SuffixIndex::Extend(int32_t seq, absl::Span<const TokenId> tokens) {
  const int32_t from = static_cast<int32_t>(seqs_[seq].tokens.size());
  seqs_[seq].tokens.insert(seqs_[seq].tokens.end(), tokens.begin(), tokens.end());
  IndexTokens(seq, from);
}

uint64_t SuffixIndex::Key(absl::Span<const TokenId> tokens, size_t pos) const {
  const auto last = static_cast<uint32_t>(tokens[pos]);
  return key_len_ == 1 ? last : (static_cast<uint64_t>(static_cast<uint32_t>(tokens[pos - 1])) << 32) | last;
}

void SuffixIndex::IndexTokens(int32_t seq, int32_t from) {
  const Seq& s = seqs_[seq];
  for (int32_t pos = std::max(from, key_len_ - 1); pos < static_cast<int32_t>(s.tokens.size()); ++pos) {
    index_[Key(s.tokens, pos)].push_back({seq, s.gen, pos});
  }
  live_tokens_ += static_cast<int64_t>(s.tokens.size()) - from;
  live_entries_ += Entries(s.tokens.size()) - Entries(from);
}

void SuffixIndex::Remove(int32_t seq) {
  Seq& s = seqs_[seq];
  // Its entries stay until a compaction: skipped meanwhile by their generation.
  stale_entries_ += Entries(s.tokens.size());
  live_entries_ -= Entries(s.tokens.size());
  live_tokens_ -= static_cast<int64_t>(s.tokens.size());
  s.tokens = {};
  ++s.gen;
  free_.push_back(seq);
  if (stale_entries_ > std::max<int64_t>(live_entries_, 4096)) Compact();
}

void SuffixIndex::Compact() {
  for (auto it = index_.begin(); it != index_.end();) {
    std::vector<Entry>& v = it->second;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const Entry& e) { return seqs_[e.seq].gen != e.gen; }), v.end());
    if (v.empty()) {
      index_.erase(it++);
    } else {
      ++it;
    }
  }
  stale_entries_ = 0;
}

int32_t SuffixIndex::Match(absl::Span<const TokenId> context, int32_t max_depth, std::vector<Cursor>* at) const {
  at->clear();
  const int32_t n = static_cast<int32_t>(context.size());
  if (n < key_len_) return 0;
  auto it = index_.find(Key(context, n - 1));
  if (it == index_.end()) return 0;
  const int32_t limit = std::min(std::max(max_depth, key_len_), n);
  int32_t best = 0;
  for (const Entry& e : it->second) {
    const Seq& s = seqs_[e.seq];
    // Removed, or nothing follows it yet (a request's own last token).
    if (s.gen != e.gen || e.pos + 1 >= static_cast<int32_t>(s.tokens.size())) continue;
    int32_t m = key_len_;  // the key's tokens match
    while (m < limit && m <= e.pos && s.tokens[e.pos - m] == context[n - 1 - m]) ++m;
    if (m < best) continue;
    if (m > best) {
      best = m;
      at->clear();
    }
    at->push_back({e.seq, e.pos + 1});
  }
  return best;
}

void SuffixIndex::Follow(std::vector<Cursor> at, int32_t max_tokens, float min_prob, SuffixDraft* d) const {
  absl::flat_hash_map<TokenId, int32_t> counts;
  float prob = 1.0f;
  while (static_cast<int32_t>(d->tokens.size()) < max_tokens) {
    counts.clear();
    int32_t total = 0, best_count = 0;
    TokenId best = 0;
    for (const Cursor& c : at) {
      const std::vector<TokenId>& t = seqs_[c.seq].tokens;
      if (c.pos >= static_cast<int32_t>(t.size())) continue;  // this occurrence ends here
      const int32_t n = ++counts[t[c.pos]];
      ++total;
      if (n > best_count || (n == best_count && t[c.pos] < best)) {  // ties: the lower id, for determinism
        best = t[c.pos];
        best_count = n;
      }
    }
    if (total == 0) break;
    const float p = prob * (static_cast<float>(best_count) / static_cast<float>(total));
    if (p < min_prob) break;
    prob = p;
    d->tokens.push_back(best);
    d->score += prob;
    // The occurrences that continue with `best`, one token further.
    size_t kept = 0;
    for (const Cursor& c : at) {
      const std::vector<TokenId>& t = seqs_[c.seq].tokens;
      if (c.pos < static_cast<int32_t>(t.size()) && t[c.pos] == best) at[kept++] = {c.seq, c.pos + 1};
    }
    at.resize(kept);
  }
  if (d->tokens.empty()) return;
  for (const Cursor& c : at) d->sources.push_back(c.seq);
  std::sort(d->sources.begin(), d->sources.end());
  d->sources.erase(std::unique(d->sources.begin(), d->sources.end()), d->sources.end());
}

SuffixDraft SuffixIndex::Speculate(absl::Span<const TokenId> context, int32_t k, const SuffixParams& p) const {
  SuffixDraft d;
  std::vector<Cursor> at;
  d.match_len = Match(context, p.max_depth, &at);
  if (d.match_len == 0) return d;
  const auto cap = static_cast<int32_t>(static_cast<float>(d.match_len) * p.max_spec_factor + p.max_spec_offset + 1e-6f);
  Follow(std::move(at), std::min(k, cap), p.min_prob, &d);
  return d;
}

void SuffixCache::Insert(absl::Span<const TokenId> tokens) {
  if (max_tokens_ <= 0 || tokens.empty()) return;
  if (static_cast<int64_t>(tokens.size()) > max_tokens_) tokens = tokens.subspan(tokens.size() - max_tokens_);
  while (!lru_.empty() && index_.num_tokens() + static_cast<int64_t>(tokens.size()) > max_tokens_) {
    index_.Remove(lru_.back());
    where_.erase(lru_.back());
    lru_.pop_back();
  }
  const int32_t seq = index_.Add(tokens);
  lru_.push_front(seq);
  where_[seq] = lru_.begin();
}

void SuffixCache::Touch(const SuffixDraft& d) {
  for (int32_t seq : d.sources) {
    auto it = where_.find(seq);
    if (it != where_.end()) lru_.splice(lru_.begin(), lru_, it->second);
  }
}

}  // namespace specula
