// The structures of suffix decoding (Arctic Inference's SuffixDecoding): a set of token sequences
// searched for the longest suffix of a context, and the most supported continuation of that match.
//
// A suffix trie of depth D holds, for each context c of at most D tokens, how often each token
// followed c. SuffixIndex computes the same counts at query time from the occurrences of the
// context's last key_len tokens (an inverted index from those tokens to positions), so a cached
// token costs 16 bytes instead of up to D trie nodes: a 1M-token cache is 16 MB at any depth.
// Matches shorter than key_len are not found: the shared cache keys on 2 tokens, since the
// occurrences of one common token in a large cache are too many to scan at every step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "core/batch.h"

namespace specula {

// Arctic's names in brackets.
struct SuffixParams {
  int32_t max_depth = 64;         // longest context matched, in tokens [max_tree_depth]
  float min_prob = 0.1f;          // stop once the path's probability is below this [min_token_prob]
  float max_spec_factor = 1.0f;   // drafts <= factor x match length + offset (and <= k) [max_spec_factor]
  float max_spec_offset = 0.0f;   // [max_spec_offset]
};

struct SuffixDraft {
  std::vector<TokenId> tokens;
  float score = 0;         // sum of the tokens' path probabilities (the expected accepted tokens)
  int32_t match_len = 0;   // context tokens matched
  std::vector<int32_t> sources;  // sequences (handles) that continue with the whole draft
};

class SuffixIndex {
 public:
  explicit SuffixIndex(int32_t key_len = 1) : key_len_(key_len) {}
  // Adds a sequence; its handle is reused once it is removed.
  int32_t Add(absl::Span<const TokenId> tokens);
  // Appends to sequence `seq` (a request's own sequence grows this way).
  void Extend(int32_t seq, absl::Span<const TokenId> tokens);
  void Remove(int32_t seq);
  absl::Span<const TokenId> sequence(int32_t seq) const { return seqs_[seq].tokens; }
  int64_t num_tokens() const { return live_tokens_; }
  // Index entries, removed sequences' included until they are compacted away (tests).
  int64_t num_entries() const { return live_entries_ + stale_entries_; }

  // The longest suffix of `context` (at least key_len and at most max(key_len, p.max_depth)
  // tokens) that occurs with a next token;
  // from there, while the path's probability stays >= p.min_prob, the next token most often seen
  // after the path, probability count / (occurrences that have a next token). At most k tokens and
  // p.max_spec_factor x match length + p.max_spec_offset. No match: no tokens.
  SuffixDraft Speculate(absl::Span<const TokenId> context, int32_t k, const SuffixParams& p) const;

 private:
  struct Seq {
    std::vector<TokenId> tokens;
    uint32_t gen = 0;  // bumped on removal: index entries of an older generation are stale
  };
  struct Entry {  // seqs_[seq].tokens[pos], while seqs_[seq].gen == gen
    int32_t seq;
    uint32_t gen;
    int32_t pos;
  };
  struct Cursor {  // the next token of an occurrence: seqs_[seq].tokens[pos]
    int32_t seq;
    int32_t pos;
  };
  // The longest match's length and, in `at`, where each of its occurrences continues.
  int32_t Match(absl::Span<const TokenId> context, int32_t max_depth, std::vector<Cursor>* at) const;
  // Appends to d the greedy path from `at` (consumed).
  void Follow(std::vector<Cursor> at, int32_t max_tokens, float min_prob, SuffixDraft* d) const;
  void IndexTokens(int32_t seq, int32_t from);
  void Compact();
  // The index key of the key_len tokens ending at tokens[pos].
  uint64_t Key(absl::Span<const TokenId> tokens, size_t pos) const;
  int64_t Entries(size_t len) const { return std::max<int64_t>(0, static_cast<int64_t>(len) - (key_len_ - 1)); }

  int32_t key_len_;  // 1 or 2
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_;
  absl::flat_hash_map<uint64_t, std::vector<Entry>> index_;
  int64_t live_tokens_ = 0, live_entries_ = 0, stale_entries_ = 0;
};

// Finished requests' sequences, at most `max_tokens` tokens in all: inserting evicts the least
// recently used sequences whole (a draft taken from a sequence uses it).
class SuffixCache {
 public:
  // key_len: 2, or 1 where matches may be that short (max_depth 1).
  explicit SuffixCache(int64_t max_tokens, int32_t key_len = 2) : max_tokens_(max_tokens), index_(key_len) {}
  // A sequence longer than the budget keeps its last max_tokens tokens; a zero budget keeps nothing.
  void Insert(absl::Span<const TokenId> tokens);
  SuffixDraft Speculate(absl::Span<const TokenId> context, int32_t k, const SuffixParams& p) const {
    return index_.Speculate(context, k, p);
  }
  // The draft was used: its sources become the most recently used.
  void Touch(const SuffixDraft& d);
  int64_t num_tokens() const { return index_.num_tokens(); }
  int32_t num_sequences() const { return static_cast<int32_t>(lru_.size()); }
  const SuffixIndex& index() const { return index_; }

 private:
  int64_t max_tokens_;
  SuffixIndex index_;
  std::list<int32_t> lru_;  // handles, most recently used first
  absl::flat_hash_map<int32_t, std::list<int32_t>::iterator> where_;
};

}  // namespace specula
