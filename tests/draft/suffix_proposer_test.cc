// Suffix decoding's structures: the longest match, the most supported continuation and its
// probability threshold, the caps on a draft's length, the request's own index built as its tokens
// arrive, the shared cache's token budget and LRU eviction, and what a preemption's Release keeps.
// A naive reference over explicit occurrences checks Speculate on random sequences.
#include <algorithm>
#include <map>
#include <random>

#include "draft/suffix_index.h"
#include "draft/suffix_proposer.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using Tokens = std::vector<TokenId>;

SuffixParams Params(float min_prob = 0.1f, int32_t max_depth = 64) {
  SuffixParams p;
  p.min_prob = min_prob;
  p.max_depth = max_depth;
  return p;
}

TEST(SuffixIndexTest, LongestMatchThenMostSupportedContinuation) {
  SuffixIndex index;
  index.Add({1, 2, 3, 4, 5, 6});
  index.Add({0, 2, 3, 4, 5, 7});
  index.Add({2, 3, 4, 9});
  // "2 3 4" in all three: 5 follows twice in three (2/3), then 6 or 7 once each (tie: the lower id;
  // 2/3 x 1/2), then the first sequence ends.
  SuffixDraft d = index.Speculate(Tokens{8, 2, 3, 4}, 8, Params());
  EXPECT_EQ(d.tokens, (Tokens{5, 6}));
  EXPECT_EQ(d.match_len, 3);
  EXPECT_NEAR(d.score, 2.0 / 3 + 1.0 / 3, 1e-5);
  EXPECT_EQ(d.sources, (std::vector<int32_t>{0}));
  // A longer match wins over support: "1 2 3 4" occurs only in the first.
  d = index.Speculate(Tokens{1, 2, 3, 4}, 8, Params());
  EXPECT_EQ(d.tokens, (Tokens{5, 6}));
  EXPECT_EQ(d.match_len, 4);
  EXPECT_NEAR(d.score, 2.0, 1e-5);
  // The threshold: 1/3 < 0.5 stops after the first token.
  d = index.Speculate(Tokens{8, 2, 3, 4}, 8, Params(0.5f));
  EXPECT_EQ(d.tokens, (Tokens{5}));
  // Neither the last token nor anything matches: no draft.
  EXPECT_TRUE(index.Speculate(Tokens{42}, 8, Params()).tokens.empty());
  EXPECT_EQ(index.Speculate(Tokens{42}, 8, Params()).match_len, 0);
  EXPECT_TRUE(index.Speculate(Tokens{}, 8, Params()).tokens.empty());
}

TEST(SuffixIndexTest, DraftsAreCappedByKAndByTheMatchLength) {
  SuffixIndex index;
  index.Add({1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(index.Speculate(Tokens{1, 2, 3}, 8, Params()).tokens, (Tokens{4, 5, 6}));  // 1 x match of 3
  EXPECT_EQ(index.Speculate(Tokens{1, 2, 3}, 2, Params()).tokens, (Tokens{4, 5}));     // k = 2
  EXPECT_EQ(index.Speculate(Tokens{7, 3}, 8, Params()).tokens, (Tokens{4}));           // match of 1
  SuffixParams wide = Params();
  wide.max_spec_factor = 2.0f;
  wide.max_spec_offset = 1.0f;
  EXPECT_EQ(index.Speculate(Tokens{7, 3}, 8, wide).tokens, (Tokens{4, 5, 6}));  // 2 x 1 + 1
  // max_depth bounds the match (and so the cap).
  const SuffixDraft d = index.Speculate(Tokens{1, 2, 3, 4, 5}, 8, Params(0.1f, 2));
  EXPECT_EQ(d.match_len, 2);
  EXPECT_EQ(d.tokens, (Tokens{6, 7}));
}

TEST(SuffixIndexTest, RemovedSequencesStopMatchingAndAreCompactedAway) {
  SuffixIndex index;
  const int32_t a = index.Add({1, 2, 3});
  index.Add({5, 6, 7});
  index.Remove(a);
  EXPECT_TRUE(index.Speculate(Tokens{1, 2}, 4, Params()).tokens.empty());
  EXPECT_EQ(index.Speculate(Tokens{5, 6}, 4, Params()).tokens, (Tokens{7}));
  EXPECT_EQ(index.num_tokens(), 3);
  for (int i = 0; i < 5000; ++i) index.Remove(index.Add({1, 2, 3, 4}));
  EXPECT_EQ(index.num_tokens(), 3);
  EXPECT_LT(index.num_entries(), 5000);  // 20003 if removed sequences' entries were kept
  EXPECT_GE(index.num_entries(), 3);
  EXPECT_EQ(index.Speculate(Tokens{5, 6}, 4, Params()).tokens, (Tokens{7}));
}

TEST(SuffixCacheTest, EvictsLeastRecentlyUsedSequencesWholeWithinItsBudget) {
  SuffixCache cache(10);
  cache.Insert({1, 2, 3, 4});   // A
  cache.Insert({5, 6, 7, 8});   // B
  const SuffixDraft a = cache.Speculate(Tokens{1, 2}, 4, Params());
  EXPECT_EQ(a.tokens, (Tokens{3, 4}));
  cache.Touch(a);               // A is now the most recently used
  cache.Insert({9, 10, 11, 12});  // 12 tokens > 10: B goes, not A
  EXPECT_EQ(cache.num_sequences(), 2);
  EXPECT_EQ(cache.num_tokens(), 8);
  EXPECT_TRUE(cache.Speculate(Tokens{5, 6}, 4, Params()).tokens.empty());
  EXPECT_EQ(cache.Speculate(Tokens{1, 2}, 4, Params()).tokens, (Tokens{3, 4}));
  // Longer than the budget: its last 10 tokens, alone.
  cache.Insert({20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31});
  EXPECT_EQ(cache.num_sequences(), 1);
  EXPECT_EQ(cache.num_tokens(), 10);
  EXPECT_TRUE(cache.Speculate(Tokens{20, 21}, 4, Params()).tokens.empty());
  EXPECT_EQ(cache.Speculate(Tokens{22, 23}, 4, Params()).tokens, (Tokens{24, 25}));
  SuffixCache none(0);
  none.Insert({1, 2, 3});
  EXPECT_EQ(none.num_tokens(), 0);
}

// The shared cache is keyed on two tokens: a one-token match is not looked for there (a request's
// own index, keyed on one, finds it).
TEST(SuffixCacheTest, MatchesAtLeastTwoTokens) {
  SuffixCache cache(100);
  cache.Insert({1, 2, 3, 4});
  EXPECT_TRUE(cache.Speculate(Tokens{9, 2}, 4, Params()).tokens.empty());
  EXPECT_EQ(cache.Speculate(Tokens{1, 2}, 4, Params()).tokens, (Tokens{3, 4}));
  EXPECT_EQ(cache.index().num_entries(), 3);  // positions 1-3: each with the token before it
  SuffixIndex own;
  own.Add({1, 2, 3, 4});
  EXPECT_EQ(own.Speculate(Tokens{9, 2}, 4, Params()).tokens, (Tokens{3}));
  EXPECT_EQ(own.num_entries(), 4);
}

TEST(SuffixProposerTest, DraftsFromTheRequestsOwnSequenceAsItGrows) {
  std::map<int, ProposerSlot> slot;  // each request's, as its record holds it
  SuffixProposer p(Params(), 1000);
  EXPECT_TRUE(p.Draft(slot[1], Tokens{1, 2, 3}, 4).empty());  // its own last token has nothing after it
  EXPECT_EQ(p.Draft(slot[1], Tokens{1, 2, 3, 1, 2}, 4), (Tokens{3, 1}));  // "1 2" matched: at most 2
  // "1 2 3 1 2" matched, and its continuation runs into the sequence's end after 3 tokens.
  EXPECT_EQ(p.Draft(slot[1], Tokens{1, 2, 3, 1, 2, 3, 1, 2}, 4), (Tokens{3, 1, 2}));
  EXPECT_EQ(p.Draft(slot[1], Tokens{1, 2, 3, 1, 2, 3, 1, 2, 3, 1}, 4), (Tokens{2, 3, 1}));
  // The same as an index built at once.
  SuffixProposer fresh(Params(), 1000);
  ProposerSlot fresh_slot;
  EXPECT_EQ(fresh.Draft(fresh_slot, Tokens{1, 2, 3, 1, 2, 3, 1, 2, 3, 1}, 4), (Tokens{2, 3, 1}));
  // A slot whose sequence is not a prefix of the new one starts over.
  EXPECT_TRUE(p.Draft(slot[1], Tokens{7, 8}, 4).empty());
  std::vector<Proposal> out;
  const Tokens seq = {4, 5, 4};
  ASSERT_TRUE(p.Propose({{2, &slot[2], seq, 1}, {3, &slot[3], Tokens{9}, 4}}, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].tokens, (Tokens{5}));
  EXPECT_TRUE(out[0].probs.empty());  // one-hot
  EXPECT_TRUE(out[1].tokens.empty());
}

TEST(SuffixProposerTest, LearnsFinishedRequestsOnceAndNotFromPreemptions) {
  std::map<int, ProposerSlot> slot;  // each request's, as its record holds it
  SuffixProposer p(Params(0.1f, 2), 1000);
  const Tokens prompt = {1, 2, 3, 4, 5}, full = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_TRUE(p.Draft(slot[1], Tokens(full.begin(), full.begin() + 6), 4).empty());
  ASSERT_NE(slot[1], nullptr);
  p.Preempted(slot[1]);  // its own index goes, nothing is cached
  EXPECT_EQ(slot[1], nullptr);
  EXPECT_EQ(p.cache().num_sequences(), 0);
  EXPECT_TRUE(p.Draft(slot[1], Tokens(full.begin(), full.begin() + 7), 4).empty());  // back, rebuilt
  p.Finished(slot[1].get(), full, static_cast<int32_t>(prompt.size()));
  slot.erase(1);
  // Cached once: the output and max_depth (2) tokens of prompt before it.
  EXPECT_EQ(p.cache().num_sequences(), 1);
  EXPECT_EQ(p.cache().num_tokens(), 5);
  // Another request with the same prompt drafts the output (a match of 2: 2 tokens).
  EXPECT_EQ(p.Draft(slot[2], prompt, 4), (Tokens{6, 7}));
}

TEST(SuffixProposerTest, TakesTheHigherScoringOfItsOwnAndTheSharedDraft) {
  std::map<int, ProposerSlot> slot;  // each request's, as its record holds it
  SuffixProposer p(Params(), 1000);
  p.Finished(nullptr, Tokens{0, 1, 7, 5, 8, 8, 8}, 0);
  // Own: "7 5" once before, then 6 1 (score 2). Shared: "1 7 5" then 8 8 8 (score 3).
  EXPECT_EQ(p.Draft(slot[1], Tokens{7, 5, 6, 1, 7, 5}, 3), (Tokens{8, 8, 8}));
  // Own: "3 1 7 5" then 6 1 2 (score 3) ties the shared 8 8 8 (score 3): own wins ties.
  EXPECT_EQ(p.Draft(slot[2], Tokens{3, 1, 7, 5, 6, 1, 2, 3, 1, 7, 5}, 3), (Tokens{6, 1, 2}));
  // The shared draft splits 8 / 9 (8 8 8 at 1/2 each: score 1.5), below own's 2 1 7 (score 3).
  p.Finished(nullptr, Tokens{0, 1, 7, 5, 9, 9, 9}, 0);
  EXPECT_EQ(p.Draft(slot[3], Tokens{4, 1, 7, 5, 2, 1, 7, 5}, 3), (Tokens{2, 1, 7}));
}

// The reference: every position's match length by direct comparison, the longest kept, then the
// continuation counted afresh at each step.
SuffixDraft Naive(const std::vector<Tokens>& seqs, const Tokens& ctx, int32_t k, const SuffixParams& p, int key_len) {
  SuffixDraft d;
  std::vector<std::pair<int, int>> at;  // (sequence, position of the next token)
  const int n = static_cast<int>(ctx.size());
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    for (int i = 0; i + 1 < static_cast<int>(seqs[s].size()); ++i) {
      int m = 0;
      while (m < std::min(std::max(p.max_depth, key_len), n) && m <= i && seqs[s][i - m] == ctx[n - 1 - m]) ++m;
      if (m < key_len || m < d.match_len) continue;
      if (m > d.match_len) at.clear();
      d.match_len = m;
      at.push_back({s, i + 1});
    }
  }
  const int cap = std::min(k, static_cast<int>(d.match_len * p.max_spec_factor + p.max_spec_offset + 1e-6f));
  float prob = 1;
  while (d.match_len > 0 && static_cast<int>(d.tokens.size()) < cap) {
    std::map<TokenId, int> counts;
    int total = 0;
    for (auto [s, i] : at) {
      if (i < static_cast<int>(seqs[s].size())) ++counts[seqs[s][i]], ++total;
    }
    if (total == 0) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) best = it->second > best->second ? it : best;
    const float next = prob * (static_cast<float>(best->second) / static_cast<float>(total));
    if (next < p.min_prob) break;
    prob = next;
    d.tokens.push_back(best->first);
    d.score += prob;
    std::vector<std::pair<int, int>> kept;
    for (auto [s, i] : at) {
      if (i < static_cast<int>(seqs[s].size()) && seqs[s][i] == best->first) kept.push_back({s, i + 1});
    }
    at = kept;
  }
  return d;
}

TEST(SuffixIndexTest, AgreesWithANaiveReferenceOnRandomSequences) {
  std::mt19937 rng(7);
  int drafted = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int vocab = 2 + trial % 6;
    const int key_len = 1 + trial % 2;
    std::uniform_int_distribution<TokenId> token(0, vocab - 1);
    std::vector<Tokens> seqs(1 + trial % 4);
    SuffixIndex index(key_len);
    for (Tokens& s : seqs) {
      s.resize(1 + rng() % 30);
      for (TokenId& t : s) t = token(rng);
      index.Add(s);
    }
    Tokens ctx(1 + rng() % 12);
    for (TokenId& t : ctx) t = token(rng);
    const SuffixParams p = Params(trial % 3 == 0 ? 0.0f : 0.3f, 1 + trial % 9);
    const int32_t k = 1 + trial % 8;
    const SuffixDraft want = Naive(seqs, ctx, k, p, key_len), got = index.Speculate(ctx, k, p);
    EXPECT_EQ(got.tokens, want.tokens) << "trial " << trial;
    EXPECT_EQ(got.match_len, want.match_len) << "trial " << trial;
    EXPECT_NEAR(got.score, want.score, 1e-4) << "trial " << trial;
    EXPECT_LE(static_cast<int32_t>(got.tokens.size()), k);
    drafted += got.tokens.empty() ? 0 : 1;
  }
  EXPECT_GT(drafted, 300);
}

}  // namespace
}  // namespace specula
