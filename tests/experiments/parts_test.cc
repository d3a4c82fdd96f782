// `experiment run --part I/N`: the flag's value, and the split: every point in exactly one part,
// whole groups (a speedup with its none baseline), balanced, the same on every call.
#include "experiments/parts.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace specula::experiments {
namespace {

TEST(ParsePart, TakesIOverNAndRefusesTheRest) {
  auto p = ParsePart("2/3");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->index, 2);
  EXPECT_EQ(p->count, 3);
  EXPECT_TRUE(ParsePart("0/1")->whole());
  for (const auto& [text, error] : std::map<std::string, std::string>{
           {"3/3", "--part: 3/3: I must be in [0, 2]"},
           {"-1/3", "--part: -1/3: I must be in [0, 2]"},
           {"0/0", "--part: 0/0: N must be at least 1"},
           {"1/-2", "--part: 1/-2: N must be at least 1"},
           {"1", "--part: '1' is not I/N"},
           {"a/3", "--part: 'a/3' is not I/N"},
           {"1/3/4", "--part: '1/3/4' is not I/N"},
           {"", "--part: '' is not I/N"}}) {
    auto bad = ParsePart(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find(error), std::string::npos) << bad.status();
  }
}

// A sweep as ExpandSweep makes them: for each (max_num_seqs, temperature), none and two methods at
// two k.
std::vector<Point> Sweep() {
  std::vector<Point> points;
  for (int32_t seqs : {1, 8, 32}) {
    for (double t : {0.0, 0.8}) {
      Point none;
      none.max_num_seqs = seqs;
      none.temperature = t;
      points.push_back(none);
      for (const char* method : {"draft", "ngram"}) {
        for (int32_t k : {2, 4}) {
          Point p = none;
          p.spec_method = method;
          p.num_spec_tokens = k;
          points.push_back(p);
        }
      }
    }
  }
  return points;
}

TEST(PointsOfPart, EveryPointOnceInWholeGroupsBalanced) {
  const std::vector<Point> sweep = Sweep();  // 6 groups of 5
  for (int32_t n : {1, 2, 3, 4, 6, 7}) {
    std::map<std::string, int32_t> part_of_key, part_of_group;
    std::vector<size_t> sizes;
    for (int32_t i = 0; i < n; ++i) {
      const std::vector<Point> part = PointsOfPart(sweep, Part{i, n});
      sizes.push_back(part.size());
      for (const Point& p : part) {
        EXPECT_TRUE(part_of_key.emplace(p.Key(), i).second) << p.Key() << " in two parts of " << n;
        auto [it, fresh] = part_of_group.emplace(GroupKey(p), i);
        EXPECT_EQ(it->second, i) << p.Key() << ": its group is split over parts of " << n;
      }
      EXPECT_EQ(PointsOfPart(sweep, Part{i, n}).size(), part.size());  // the same split every time
    }
    EXPECT_EQ(part_of_key.size(), sweep.size()) << n;
    const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
    EXPECT_LE(*hi - *lo, 5u) << n;  // at most one group apart
  }
  // The group of a speculative point is its none baseline's key.
  EXPECT_EQ(GroupKey(sweep[3]), sweep[0].Key());
}

}  // namespace
}  // namespace specula::experiments
