#include "scheduler/block_manager.h"

#include "gtest/gtest.h"

namespace specula {
namespace {

std::vector<TokenId> Tokens(int32_t n, int32_t salt = 0) {
  std::vector<TokenId> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = (i * 31 + salt) % 97;
  return t;
}

TEST(BlockManagerTest, ReserveTruncateRelease) {
  BlockManager bm(8, 4, false);
  std::vector<BlockId> t;
  ASSERT_TRUE(bm.Reserve(&t, 9));  // 3 blocks
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(bm.num_available(), 5);
  ASSERT_TRUE(bm.Reserve(&t, 12));  // still 3
  EXPECT_EQ(t.size(), 3u);
  EXPECT_FALSE(bm.Reserve(&t, 40));  // 10 blocks: refused, nothing changed
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(bm.num_available(), 5);
  bm.Truncate(&t, 5);  // lookahead given back: 2 blocks remain
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(bm.num_available(), 6);
  bm.Release(&t);
  EXPECT_EQ(bm.num_available(), 8);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

// Table: which prefix of a second sequence hits the cache after a first one committed 12 tokens.
TEST(BlockManagerTest, PrefixHitsPartialHitsAndMisses) {
  struct Case {
    const char* name;
    std::vector<TokenId> second;
    int32_t max_tokens;
    int32_t want_matched;
  };
  const std::vector<TokenId> first = Tokens(12);  // 3 full blocks of 4
  std::vector<TokenId> diverge_in_block2 = first;
  diverge_in_block2[5] = 999;
  std::vector<TokenId> diverge_first = first;
  diverge_first[0] = 999;
  const std::vector<Case> cases = {
      {"full hit", first, 12, 12},
      {"hit capped by max_tokens", first, 11, 8},
      {"longer prompt, same prefix", [&] { auto v = first; v.push_back(5); v.push_back(6); return v; }(), 13, 12},
      {"partial hit: second block differs", diverge_in_block2, 12, 4},
      {"miss", diverge_first, 12, 0},
      {"shorter than a block", Tokens(3), 3, 0},
  };
  for (const Case& c : cases) {
    BlockManager bm(16, 4, true);
    std::vector<BlockId> t1;
    ASSERT_TRUE(bm.Reserve(&t1, 12));
    std::vector<BlockHash> chain;
    bm.Commit(first, 12, t1, {}, &chain);
    EXPECT_EQ(chain.size(), 3u);
    std::vector<BlockId> t2;
    EXPECT_EQ(bm.MatchPrefix(c.second, c.max_tokens, {}, &t2), c.want_matched) << c.name;
    ASSERT_EQ(t2.size(), static_cast<size_t>(c.want_matched / 4)) << c.name;
    for (size_t i = 0; i < t2.size(); ++i) {
      EXPECT_EQ(t2[i], t1[i]) << c.name;  // shared, not copied
      EXPECT_EQ(bm.ref_count(t2[i]), 2) << c.name;
    }
    bm.Release(&t1);
    bm.Release(&t2);
    EXPECT_TRUE(bm.CheckInvariants().ok()) << c.name;
    EXPECT_EQ(bm.num_available(), 16) << c.name;
    for (BlockId b = 0; b < 16; ++b) EXPECT_EQ(bm.ref_count(b), 0);
  }
}

TEST(BlockManagerTest, UnusedCachedBlocksAreEvictedLeastRecentlyUsedFirst) {
  BlockManager bm(4, 2, true);
  auto commit = [&](const std::vector<TokenId>& toks) {
    std::vector<BlockId> t;
    EXPECT_TRUE(bm.Reserve(&t, static_cast<int32_t>(toks.size())));
    std::vector<BlockHash> chain;
    bm.Commit(toks, static_cast<int32_t>(toks.size()), t, {}, &chain);
    bm.Release(&t);  // cached, ref 0: evictable
  };
  const auto a = Tokens(2, 1), b = Tokens(2, 2), c = Tokens(2, 3);
  commit(a);
  commit(b);
  EXPECT_EQ(bm.num_available(), 4);
  std::vector<BlockId> hit;
  EXPECT_EQ(bm.MatchPrefix(a, 2, {}, &hit), 2);  // touch a: b is now the least recently used
  bm.Release(&hit);
  std::vector<BlockId> big;
  ASSERT_TRUE(bm.Reserve(&big, 6));  // 3 blocks: 2 free + evicts b (LRU)
  std::vector<BlockId> probe;
  EXPECT_EQ(bm.MatchPrefix(b, 2, {}, &probe), 0);
  EXPECT_EQ(bm.MatchPrefix(a, 2, {}, &probe), 2);
  bm.Release(&probe);
  bm.Release(&big);
  commit(c);
  EXPECT_TRUE(bm.CheckInvariants().ok());
  EXPECT_EQ(bm.num_available(), 4);
}

TEST(BlockManagerTest, DuplicateContentIsNotRegisteredTwice) {
  BlockManager bm(8, 2, true);
  const auto toks = Tokens(4);
  std::vector<BlockId> t1, t2;
  ASSERT_TRUE(bm.Reserve(&t1, 4));
  ASSERT_TRUE(bm.Reserve(&t2, 4));  // computed independently, same content
  std::vector<BlockHash> c1, c2;
  bm.Commit(toks, 4, t1, {}, &c1);
  bm.Commit(toks, 4, t2, {}, &c2);
  EXPECT_EQ(c1, c2);
  bm.Release(&t1);
  bm.Release(&t2);
  EXPECT_TRUE(bm.CheckInvariants().ok());
  EXPECT_EQ(bm.num_available(), 8);
}

// A request's cache_salt roots its chain: the same tokens under another salt never match.
TEST(BlockManagerTest, DifferentSaltsNeverShareBlocks) {
  BlockManager bm(8, 2, true);
  const auto toks = Tokens(4);
  std::vector<BlockId> t;
  ASSERT_TRUE(bm.Reserve(&t, 4));
  std::vector<BlockHash> chain;
  bm.Commit(toks, 4, t, SaltRoot("tenant-a"), &chain);
  bm.Release(&t);
  std::vector<BlockId> probe;
  EXPECT_EQ(bm.MatchPrefix(toks, 4, {}, &probe), 0);
  EXPECT_EQ(bm.MatchPrefix(toks, 4, SaltRoot("tenant-b"), &probe), 0);
  EXPECT_EQ(bm.MatchPrefix(toks, 4, SaltRoot("tenant-a"), &probe), 4);
  EXPECT_EQ(chain, ChainHashes(SaltRoot("tenant-a"), toks, 4, 2));
  EXPECT_NE(ChainHashes({}, toks, 4, 2), chain);
  bm.Release(&probe);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

// Blocks computed elsewhere enter as cached blocks that a later prefix match finds, in order; a
// hash already cached is shared, not installed twice; the pool running out stops the install.
TEST(BlockManagerTest, InstalledBlocksAreMatchedLikeCommittedOnes) {
  BlockManager bm(3, 2, true);
  const auto toks = Tokens(8);
  const std::vector<BlockHash> chain = ChainHashes({}, toks, 8, 2);
  std::vector<BlockId> table;
  std::vector<BlockId> installed;
  for (int i = 0; i < 4; ++i) {
    std::optional<BlockId> b = bm.Install(chain[i], absl::MakeConstSpan(toks).subspan(2 * i, 2), &table);
    if (i < 3) {
      ASSERT_TRUE(b.has_value()) << i;
      EXPECT_GE(*b, 0);
    } else {
      EXPECT_FALSE(b.has_value());  // every block is taken by the install itself
    }
  }
  EXPECT_EQ(bm.CachedBlocks(chain), 3);
  EXPECT_EQ(bm.Install(chain[0], absl::MakeConstSpan(toks).first(2), &installed), std::optional<BlockId>(-1));
  bm.Release(&installed);
  bm.Release(&table);  // cached, evictable
  std::vector<BlockId> hit;
  EXPECT_EQ(bm.MatchPrefix(toks, 7, {}, &hit), 6);
  bm.Release(&hit);
  EXPECT_TRUE(bm.CheckInvariants().ok());
  EXPECT_EQ(bm.ResetPrefixCache(), 3);
  EXPECT_EQ(bm.CachedBlocks(chain), 0);
  EXPECT_EQ(bm.MatchPrefix(toks, 7, {}, &hit), 0);
  EXPECT_EQ(bm.num_available(), 3);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

// A flush while a sequence holds cached blocks: they stay its own, are matched no more, and are
// free once released.
TEST(BlockManagerTest, ResetKeepsBlocksInUse) {
  BlockManager bm(4, 2, true);
  const auto toks = Tokens(4);
  std::vector<BlockId> t;
  ASSERT_TRUE(bm.Reserve(&t, 4));
  std::vector<BlockHash> chain;
  bm.Commit(toks, 4, t, {}, &chain);
  EXPECT_EQ(bm.ResetPrefixCache(), 2);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(bm.ref_count(t[0]), 1);
  std::vector<BlockId> probe;
  EXPECT_EQ(bm.MatchPrefix(toks, 4, {}, &probe), 0);
  bm.Release(&t);
  EXPECT_EQ(bm.num_available(), 4);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

}  // namespace
}  // namespace specula
