// The step-cost cache on disk (spec/cost_cache.h): tables survive the process that measured them,
// only for the same identity, and a damaged or foreign file is never trusted.
#include "spec/cost_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula {
namespace {

std::string TempDir() { return testing::MakeTempDir(); }

const std::vector<CostPoint> kPoints = {{1e8, 0.004, 1}, {2e8, 0.0045, 2}, {4e8, 0.0052, 4}};

void ExpectSame(const std::vector<CostPoint>& a, const std::vector<CostPoint>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].flops, b[i].flops);
    EXPECT_EQ(a[i].seconds, b[i].seconds);
    EXPECT_EQ(a[i].tokens, b[i].tokens);
  }
}

// The one cache file of `dir`.
std::string OnlyFile(const std::string& dir) {
  std::string found;
  for (const auto& e : std::filesystem::directory_iterator(dir)) found = e.path();
  return found;
}

TEST(CostCacheTest, TablesOutliveTheStoreThatWroteThem) {
  const std::string dir = TempDir() + "/a/b";  // created on open
  const CostIdentity id{{"model", "m.gguf"}, {"build", "1"}};
  {
    auto store = OpenCostCache(dir, id);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->Get("kv=f32 batch=8 block=16").empty());
    (*store)->Put("kv=f32 batch=8 block=16", kPoints);
  }
  auto again = OpenCostCache(dir, id);
  ASSERT_TRUE(again.ok());
  ExpectSame((*again)->Get("kv=f32 batch=8 block=16"), kPoints);
  EXPECT_TRUE((*again)->Get("kv=bf16 batch=8 block=16").empty());  // another table
  // Another identity (a rebuilt engine) starts empty, in a file of its own.
  auto other = OpenCostCache(dir, {{"model", "m.gguf"}, {"build", "2"}});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->Get("kv=f32 batch=8 block=16").empty());
}

TEST(CostCacheTest, DamagedFilesAreIgnoredAndReplaced) {
  const std::string dir = TempDir();
  const CostIdentity id{{"model", "m.gguf"}};
  (*OpenCostCache(dir, id))->Put("t", kPoints);
  const std::string path = OnlyFile(dir);
  ASSERT_FALSE(path.empty());
  const std::string good = [&] {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  for (const std::string& bad : {std::string("{not json"), good.substr(0, good.size() / 2), std::string("[]"),
                                 // seconds negative, tokens out of order
                                 std::string(good).replace(good.find("0.004"), 5, "-0.04"),
                                 std::string(good).replace(good.find("\"tokens\": 2"), 11, "\"tokens\": 1")}) {
    std::ofstream(path) << bad;
    auto store = OpenCostCache(dir, id);
    ASSERT_TRUE(store.ok());
    EXPECT_TRUE((*store)->Get("t").empty()) << bad;
    (*store)->Put("t", kPoints);  // replaced whole
    ExpectSame((*OpenCostCache(dir, id))->Get("t"), kPoints);
  }
}

TEST(CostCacheTest, AFileWithAnotherIdentityIsNotTrusted) {
  const std::string dir = TempDir();
  (*OpenCostCache(dir, {{"model", "a"}}))->Put("t", kPoints);
  const std::string path = OnlyFile(dir);
  std::ifstream in(path);
  std::string text(std::istreambuf_iterator<char>(in), {});
  text.replace(text.find("\"a\""), 3, "\"b\"");  // as if two identities' names collided
  std::ofstream(path) << text;
  EXPECT_TRUE((*OpenCostCache(dir, {{"model", "a"}}))->Get("t").empty());
}

TEST(CostCacheTest, ADirectoryThatCannotBeMadeNamesTheFlag) {
  const std::string file = TempDir() + "/plain";
  std::ofstream(file) << "x";
  auto store = OpenCostCache(file + "/sub", {{"model", "a"}});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("--cost-cache"), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find(file), std::string::npos) << store.status();
}

TEST(CostCacheTest, AModelFilesIdentityFollowsItsSizeTimeAndHeader) {
  const std::string dir = TempDir(), path = dir + "/m.gguf";
  std::ofstream(path) << "GGUF header one";
  auto a = ModelFileIdentity(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*ModelFileIdentity(path)), *a);  // stable
  std::ofstream(path) << "GGUF header two";   // same size, new bytes and time
  struct timespec times[2] = {{1, 0}, {1, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  auto b = ModelFileIdentity(path);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->at("model_header_fnv1a"), b->at("model_header_fnv1a"));
  EXPECT_NE(a->at("model_file"), b->at("model_file"));
  auto missing = ModelFileIdentity(dir + "/none.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.gguf"), std::string::npos);
  const CostIdentity m = MachineIdentity();
  EXPECT_FALSE(m.at("cpu").empty());
  EXPECT_FALSE(m.at("build").empty());
}

}  // namespace
}  // namespace specula
