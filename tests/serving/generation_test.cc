// Server::Generate's samples (serving/server.h Generation) on the real tinystories target: n
// samples of one prompt, reproducible by seed, the later ones finding the first's prompt blocks in
// the prefix cache; a listener that reads from the engine loop's thread; a cancel before the later
// samples were submitted still ends every sample; the later samples run with no reader.
#include <atomic>
#include <map>
#include <set>
#include <tuple>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama_model.h"
#include "serving/server.h"
#include "tests/test_util.h"
#include "tests/tiny_stories.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

using std::chrono::milliseconds;

class GenerationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::tie(model_, tok_) = testing::TinyStoriesTarget();
    ASSERT_NE(model_, nullptr);
    ASSERT_NE(tok_, nullptr);
  }
  void SetUp() override {
    SchedulerConfig c;
    c.max_num_seqs = 8;
    c.block_size = 16;
    c.num_blocks = 256;
    c.max_model_len = model_->config().max_seq_len;
    engine_ = std::make_unique<Engine>(model_, tok_, c);
    ServeOptions opt;
    opt.model_name = "m";
    server_ = std::make_unique<Server>(engine_.get(), tok_, model_->config(), opt);
  }
  void TearDown() override {
    server_.reset();
    engine_.reset();
  }

  static ServeRequest Prompt(int32_t n) {
    ServeRequest r;
    r.prompt = "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog";
    r.n = n;
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.sampling.temperature = 1.0f;
    r.seed = 5;
    return r;
  }

  // Every sample's tokens, reading events until each sample's last.
  static std::map<int32_t, RequestOutput> Drain(Generation& g) {
    std::map<int32_t, RequestOutput> out;
    while (static_cast<int32_t>(out.size()) < g.n()) {
      auto e = g.Next(milliseconds(10000));
      if (!e.has_value()) {
        ADD_FAILURE() << "no event within 10 s";
        break;
      }
      if (e->delta.finished) out[e->index] = e->delta.final;
    }
    return out;
  }

  static LlamaModel* model_;
  static Tokenizer* tok_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Server> server_;
};
LlamaModel* GenerationTest::model_ = nullptr;
Tokenizer* GenerationTest::tok_ = nullptr;

TEST_F(GenerationTest, SamplesShareThePromptAndFollowTheirSeeds) {
  auto g = server_->Generate(Prompt(4));
  ASSERT_TRUE(g.ok()) << g.status();
  auto out = Drain(**g);
  ASSERT_EQ(out.size(), 4u);
  std::set<std::vector<TokenId>> distinct;
  const int32_t full = (static_cast<int32_t>((*g)->prompt().size()) - 1) / 16 * 16;
  ASSERT_GT(full, 0);
  for (auto& [i, o] : out) {
    distinct.insert(o.tokens);
    EXPECT_EQ(o.tokens.size(), 12u);
    EXPECT_EQ(o.cached_prompt_tokens, i == 0 ? 0 : full) << "sample " << i;
  }
  EXPECT_EQ(distinct.size(), 4u);
  // Sample i draws from seed + i: a single request with seed 7 is sample 2.
  ServeRequest one = Prompt(1);
  one.seed = 7;
  auto g1 = server_->Generate(one);
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(Drain(**g1)[0].tokens, out[2].tokens);
}

TEST_F(GenerationTest, AListenerReadsEveryEventFromTheLoopThread) {
  auto g = server_->Generate(Prompt(3));
  ASSERT_TRUE(g.ok());
  std::shared_ptr<Generation> gen = *g;
  std::mutex mu;
  std::map<int32_t, int32_t> tokens;  // per sample, from the listener
  std::atomic<int32_t> finished{0};
  // A listener that holds its own lock while it reads (as the gRPC front end's does) must never be
  // called again from inside its own Next: that would deadlock here, so it fails instead.
  static thread_local bool inside = false;
  gen->SetListener([&] {
    if (inside) {
      ADD_FAILURE() << "the listener was called from inside its own Next";
      return;
    }
    inside = true;
    std::lock_guard<std::mutex> lock(mu);
    while (auto e = gen->Next(milliseconds(0))) {
      tokens[e->index] += static_cast<int32_t>(e->delta.tokens.size());
      if (e->delta.finished) ++finished;
    }
    inside = false;
  });
  for (int i = 0; i < 1000 && finished < 3; ++i) std::this_thread::sleep_for(milliseconds(10));
  gen->SetListener(nullptr);
  ASSERT_EQ(finished.load(), 3);
  std::lock_guard<std::mutex> lock(mu);
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(tokens[i], 12) << "sample " << i;
}

TEST_F(GenerationTest, TheOtherSamplesRunBeforeAnyoneReads) {
  auto g = server_->Generate(Prompt(3));
  ASSERT_TRUE(g.ok());
  // Nothing reads until the server is idle: every sample must have run by then, not only sample 0.
  ASSERT_TRUE(server_->WaitIdle(milliseconds(10000)));
  const std::string metrics = server_->MetricsText();
  EXPECT_NE(metrics.find("finished_reason=\"length\"} 3.0\n"), std::string::npos) << metrics;
  // The loop counts a request finished before it pushes the last delta (EngineLoop::PublishDeltas),
  // so idle can come a moment before sample 2's last delta is in its stream: wait for it.
  std::set<int32_t> finished;
  while (finished.size() < 3) {
    auto e = (*g)->Next(milliseconds(2000));
    if (!e) break;
    if (e->delta.finished) finished.insert(e->index);
  }
  EXPECT_EQ(finished, (std::set<int32_t>{0, 1, 2}));
}

TEST_F(GenerationTest, CancelEndsEverySampleAndFreesTheBlocks) {
  auto g = server_->Generate(Prompt(4));
  ASSERT_TRUE(g.ok());
  (*g)->Cancel();  // most likely before sample 0's first token: the others never run
  auto out = Drain(**g);
  ASSERT_EQ(out.size(), 4u);
  for (auto& [i, o] : out) EXPECT_TRUE(o.finish == FinishReason::kAborted || o.tokens.size() == 12u) << i;
  EXPECT_TRUE(server_->WaitIdle(milliseconds(10000)));
  ServeRequest bad = Prompt(0);
  EXPECT_EQ(server_->Generate(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specula
