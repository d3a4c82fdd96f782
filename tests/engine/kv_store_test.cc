// Shared KV through a real redis-server on a unix socket: a second engine (another replica, its own
// KV pool) reuses the blocks the first computed and gives the tokens it would give alone; salts
// keep blocks apart, a corrupted value is refused, and a store that is gone fails no request.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <thread>

#include "draft/draft_model_proposer.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "model/weights_hash.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/kv_transfer.h"
#include "request/finish.h"
#include "tests/kvstore/redis_fixture.h"
#include "tests/test_util.h"
#include "tests/tiny_stories.h"

namespace specula {
namespace {

constexpr int32_t kBlock = 16;

class KvStoreEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::RedisServer::Available()) GTEST_SKIP() << testing::RedisServer::kSkipReason;
    std::tie(model_, tok_) = testing::TinyStoriesTarget();
    ASSERT_NE(model_, nullptr);
    ASSERT_NE(tok_, nullptr);
    ASSERT_TRUE(redis_.Start().ok());
  }

  KvStoreOptions Options() const {
    KvStoreOptions o;
    o.url = *ParseKvStoreUrl(redis_.url());
    o.timeout_ms = 200;
    return o;
  }

  // A replica: its own pool, prefix cache on, the store attached under `salt` (empty: no store),
  // speculating with `proposer` (null: none).
  std::unique_ptr<Engine> Replica(const std::string& salt, Proposer* proposer = nullptr) {
    SchedulerConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;  // prefills in chunks: blocks are committed over several steps
    c.block_size = kBlock;
    c.num_blocks = 128;
    c.max_model_len = model_->config().max_seq_len;
    SpecConfig spec;
    spec.proposer = proposer;
    c.num_spec_tokens = proposer != nullptr ? 4 : 0;
    auto e = std::make_unique<Engine>(model_, tok_, c, spec);
    if (!salt.empty()) EXPECT_TRUE(e->AttachKvStore(std::make_unique<KvTransfer>(Options()), salt).ok());
    return e;
  }

  // The key a block of replica salt "salt-1" has in the store (Engine::StoreKey's form).
  static std::string Key(const BlockHash& h) { return "specula:kv:v1:salt-1:" + h.Hex(); }

  static RequestOutput Run(Engine& e, Request r) {
    EXPECT_TRUE(e.AddRequest(std::move(r)).ok());
    RequestOutput out;
    for (int steps = 0; e.HasUnfinished() && steps < 100000; ++steps) {
      for (RequestDelta& d : e.Step()) {
        if (d.finished) out = std::move(d.final);
      }
    }
    EXPECT_FALSE(e.HasUnfinished());
    EXPECT_TRUE(e.scheduler().CheckInvariants().ok());
    return out;
  }

  static Request Turn(RequestId id, std::vector<TokenId> prompt, const std::string& cache_salt = "") {
    Request r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = 20;
    r.ignore_eos = true;
    r.cache_salt = cache_salt;
    return r;
  }

  // The first turn's prompt (about 120 tokens) and the second's: the first, its answer, and more.
  std::vector<TokenId> FirstPrompt() const {
    return tok_->Encode("Once upon a time, there was a little girl named Lily. She loved to play in the park with "
                        "her big red ball. One day, Lily saw a small cat under a tree. The cat was sad because it "
                        "lost its mom. Lily wanted to help the cat find its mom, so they walked to the big hill "
                        "and looked all around.", true);
  }
  std::vector<TokenId> SecondPrompt(const std::vector<TokenId>& first, const RequestOutput& answer) const {
    std::vector<TokenId> p = first;
    p.insert(p.end(), answer.tokens.begin(), answer.tokens.end());
    const std::vector<TokenId> more = tok_->Encode(" Then Tom came to play with them.", false);
    p.insert(p.end(), more.begin(), more.end());
    return p;
  }
  // The upper bound on reuse: the full blocks the first turn computed that the second's prompt
  // (less its last token) covers.
  static int32_t ReusableTokens(const std::vector<TokenId>& first, const RequestOutput& answer,
                                const std::vector<TokenId>& second) {
    const int32_t computed = static_cast<int32_t>(first.size() + answer.tokens.size()) - 1;
    return std::min(computed, static_cast<int32_t>(second.size()) - 1) / kBlock * kBlock;
  }

  LlamaModel* model_ = nullptr;  // loaded once per test program (tests/tiny_stories.h)
  Tokenizer* tok_ = nullptr;
  testing::RedisServer redis_;
};

TEST_F(KvStoreEngineTest, AnotherReplicaReusesTheBlocksAndGivesTheSameTokens) {
  auto a = Replica("salt-1");
  const std::vector<TokenId> first = FirstPrompt();
  const RequestOutput answer = Run(*a, Turn(1, first));
  ASSERT_EQ(answer.tokens.size(), 20u) << FinishName(answer.finish) << " " << answer.error;
  EXPECT_EQ(answer.kv_store_tokens, 0);
  EXPECT_GT(a->stats().kv_store.writes, 0);

  const std::vector<TokenId> second = SecondPrompt(first, answer);
  auto b = Replica("salt-1");
  const RequestOutput reused = Run(*b, Turn(2, second));
  const int32_t bound = ReusableTokens(first, answer, second);
  ASSERT_GE(bound, 6 * kBlock);
  EXPECT_EQ(reused.kv_store_tokens, bound);
  EXPECT_EQ(reused.cached_prompt_tokens, bound);
  EXPECT_GE(reused.kv_fetch_ms, 0);
  EXPECT_EQ(b->stats().kv_installed_blocks, bound / kBlock);
  EXPECT_EQ(b->stats().kv_rejected_blocks, 0);

  auto alone = Replica("");
  const RequestOutput computed = Run(*alone, Turn(3, second));
  EXPECT_EQ(computed.cached_prompt_tokens, 0);
  EXPECT_EQ(reused.tokens, computed.tokens);
}

// A draft model catches up on a history whose target KV came from the store (its own KV is
// computed), and speculation stays lossless: the same greedy tokens.
TEST_F(KvStoreEngineTest, ADraftModelCatchesUpOnAFetchedHistory) {
  auto a = Replica("salt-1");
  const std::vector<TokenId> first = FirstPrompt();
  const RequestOutput answer = Run(*a, Turn(1, first));
  const std::vector<TokenId> second = SecondPrompt(first, answer);
  auto draft_weights = LoadModel(testing::TinyStoriesDir() + "/stories260K-draft.bin");
  ASSERT_TRUE(draft_weights.ok()) << draft_weights.status();
  LlamaModel draft(std::move(draft_weights).value(), MakeCpuBackend());
  DraftModelProposer proposer(&draft, kBlock, 256);
  auto b = Replica("salt-1", &proposer);
  const RequestOutput reused = Run(*b, Turn(2, second));
  EXPECT_EQ(reused.kv_store_tokens, ReusableTokens(first, answer, second));
  EXPECT_GT(reused.spec.draft_tokens, 0);
  auto alone = Replica("");
  EXPECT_EQ(reused.tokens, Run(*alone, Turn(3, second)).tokens);
}

// The last delta goes out after the request's blocks are in the store: the next turn finds them
// however soon it comes.
TEST_F(KvStoreEngineTest, TheLastDeltaFollowsTheWrites) {
  auto a = Replica("salt-1");
  const std::vector<TokenId> first = FirstPrompt();
  const RequestOutput answer = Run(*a, Turn(1, first));
  std::vector<TokenId> all = first;
  all.insert(all.end(), answer.tokens.begin(), answer.tokens.end());
  const std::vector<BlockHash> chain = ChainHashes({}, all, static_cast<int32_t>(all.size()) - 1, kBlock);
  std::vector<std::string> keys;
  for (const BlockHash& h : chain) keys.push_back(Key(h));
  auto store = KvStore::Connect(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto got = (*store)->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE((*got)[i].has_value()) << "block " << i;
}

TEST_F(KvStoreEngineTest, SaltsKeepBlocksApart) {
  auto a = Replica("salt-1");
  const std::vector<TokenId> first = FirstPrompt();
  const RequestOutput answer = Run(*a, Turn(1, first, "tenant-a"));
  const std::vector<TokenId> second = SecondPrompt(first, answer);
  // Another replica salt (another KV dtype, say): nothing shared.
  auto other = Replica("salt-2");
  EXPECT_EQ(Run(*other, Turn(2, second, "tenant-a")).kv_store_tokens, 0);
  // The same replica salt, another request salt or none: nothing shared.
  auto b = Replica("salt-1");
  EXPECT_EQ(Run(*b, Turn(3, second, "tenant-b")).kv_store_tokens, 0);
  EXPECT_EQ(Run(*b, Turn(4, second)).kv_store_tokens, 0);
  // The same both: shared.
  auto c = Replica("salt-1");
  EXPECT_EQ(Run(*c, Turn(5, second, "tenant-a")).kv_store_tokens, ReusableTokens(first, answer, second));
}

TEST_F(KvStoreEngineTest, ACorruptedValueIsRefusedAndRecomputed) {
  auto a = Replica("salt-1");
  const std::vector<TokenId> first = FirstPrompt();
  const RequestOutput answer = Run(*a, Turn(1, first));
  const std::vector<TokenId> second = SecondPrompt(first, answer);
  // Flip one byte in the middle of the third block's value.
  const std::string key = Key(ChainHashes({}, first, 3 * kBlock, kBlock)[2]);
  auto store = KvStore::Connect(Options());
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Get({key});
  ASSERT_TRUE(got.ok() && (*got)[0].has_value());
  std::string value = *(*got)[0];
  value[value.size() / 2] ^= 0x5a;
  ASSERT_TRUE((*store)->Set({{key, value}}, 60).ok());

  auto b = Replica("salt-1");
  const RequestOutput reused = Run(*b, Turn(2, second));
  EXPECT_EQ(b->stats().kv_rejected_blocks, 1);
  EXPECT_EQ(reused.kv_store_tokens, 2 * kBlock);  // the run stops at the bad block
  auto alone = Replica("");
  EXPECT_EQ(reused.tokens, Run(*alone, Turn(3, second)).tokens);
}

TEST_F(KvStoreEngineTest, AStoreThatIsGoneFailsNoRequestAndReuseResumesWhenItIsBack) {
  auto a = Replica("salt-1");
  const std::vector<TokenId> first = FirstPrompt();
  const RequestOutput answer = Run(*a, Turn(1, first));
  const std::vector<TokenId> second = SecondPrompt(first, answer);
  redis_.Kill();
  auto b = Replica("salt-1");
  const RequestOutput recomputed = Run(*b, Turn(2, second));
  EXPECT_EQ(recomputed.finish, FinishReason::kMaxTokens);
  EXPECT_EQ(recomputed.kv_store_tokens, 0);
  EXPECT_GT(b->stats().kv_store.errors + b->stats().kv_store.timeouts, 0);
  auto alone = Replica("");
  EXPECT_EQ(recomputed.tokens, Run(*alone, Turn(3, second)).tokens);

  // Back, empty: b's blocks are written again by its next request, and a third replica finds them.
  // The store's connection is tried again at most once a second (kvstore/kv_store.h).
  ASSERT_TRUE(redis_.Restart().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const RequestOutput again = Run(*b, Turn(4, first));
  EXPECT_EQ(again.finish, FinishReason::kMaxTokens);
  auto c = Replica("salt-1");
  EXPECT_GE(Run(*c, Turn(5, second)).kv_store_tokens, static_cast<int32_t>(first.size() - 1) / kBlock * kBlock);
}

// What keys a replica's blocks changes with every property that changes their bits (one at a time),
// and with nothing else.
TEST(KvReplicaSaltTest, EachSaltedPropertyChangesTheSalt) {
  const std::string dir = testing::TinyStoriesDir();
  auto salt = [&](const std::string& kv_dtype, const std::string& quantization, int32_t block) {
    EngineOptions o;
    o.target.model = dir + "/stories260K.bin";
    o.target.tokenizer = dir + "/tok512.bin";
    o.target.kv_cache_dtype = kv_dtype;
    o.target.quantization = quantization;
    auto e = LoadEngine(o);
    EXPECT_TRUE(e.ok()) << e.status();
    std::string description;
    auto s = KvReplicaSalt(**e, block, "", &description);
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_NE(description.find("kv=" + (kv_dtype.empty() ? std::string("bf16") : kv_dtype)), std::string::npos);
    return *s;
  };
  const std::string base = salt("bf16", "none", 16);
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(salt("bf16", "none", 16), base);
  EXPECT_EQ(salt("", "none", 16), base);  // bf16 is the CPU's default
  EXPECT_NE(salt("f32", "none", 16), base);
  EXPECT_NE(salt("bf16", "int8", 16), base);
  EXPECT_NE(salt("bf16", "none", 32), base);
}

// The weights' hash follows their bytes, and its cache is keyed by the file's identity.
TEST(WeightsHashTest, FollowsTheBytesAndIsCached) {
  const std::string dir = ::testing::TempDir() + "/weights_hash_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = dir + "/m.bin", cache = dir + "/cache";
  auto write = [&](const std::string& bytes) {
    std::ofstream(model, std::ios::binary) << bytes;
  };
  write("weights one");
  auto first = WeightsHash(model, cache);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 16u);
  EXPECT_EQ(*WeightsHash(model, ""), *first);  // the same without the cache
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(cache), {}), 1);
  EXPECT_EQ(*WeightsHash(model, cache), *first);  // from the cache
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write("weights two");  // another size and time: another identity
  EXPECT_NE(*WeightsHash(model, cache), *first);
  EXPECT_FALSE(WeightsHash(dir + "/missing.bin", cache).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specula
