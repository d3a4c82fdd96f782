#include "draft/ngram_proposer.h"

#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(NgramProposerTest, LookupTable) {
  struct Case {
    std::vector<TokenId> tokens;
    int32_t k;
    std::vector<TokenId> want;
  };
  NgramProposer p(1, 3);
  const std::vector<Case> cases = {
      {{1, 2, 3, 4, 1, 2, 3}, 2, {4, 1}},          // 3-gram "1 2 3" seen before: propose what followed
      {{1, 2, 3, 4, 1, 2, 3}, 8, {4, 1, 2, 3}},    // capped by the tokens that exist
      {{5, 9, 7, 8, 9}, 3, {7, 8, 9}},             // only the 1-gram "9" matches
      {{1, 2, 3}, 2, {}},                          // no match
      {{7, 1, 7, 2, 7}, 1, {2}},                   // the latest earlier occurrence wins
  };
  for (const Case& c : cases) EXPECT_EQ(p.Lookup(c.tokens, c.k), c.want);
}

}  // namespace
}  // namespace specula
