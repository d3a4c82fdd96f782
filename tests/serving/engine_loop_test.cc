// The serving step loop (serving/engine_loop.h) with the real tinystories target: requests
// submitted from several threads at once stream exactly the tokens the engine gives offline;
// a cancelled request ends aborted with its KV blocks free; a bad request is refused on its
// stream; stopping the loop ends what is still running; a prefix-cache reset and a switch to
// another engine run between steps.
#include "serving/engine_loop.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <tuple>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama_model.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"
#include "tests/tiny_stories.h"

namespace specula {
namespace {

using std::chrono::milliseconds;

class EngineLoopTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::tie(model_, tok_) = testing::TinyStoriesTarget();
    ASSERT_NE(model_, nullptr);
    ASSERT_NE(tok_, nullptr);
  }

  static SchedulerConfig Config(int32_t num_blocks = 256) {
    SchedulerConfig c;
    c.max_num_seqs = 8;
    c.block_size = 16;
    c.num_blocks = num_blocks;
    c.max_model_len = model_->config().max_seq_len;
    return c;
  }

  static Request Make(RequestId id, int32_t max_tokens = 48) {
    Request r;
    r.id = id;
    r.prompt = tok_->Encode(id % 2 ? "Once upon a time" : "The little dog", true);
    r.prompt.push_back(static_cast<TokenId>(10 + id));  // each prompt its own
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Reads a stream to its end: the tokens and text of its deltas, and the last delta.
  static RequestDelta Drain(RequestStream& s, std::vector<TokenId>* tokens, std::string* text) {
    for (;;) {
      std::optional<RequestDelta> d = s.Next(milliseconds(10000));
      if (!d.has_value()) {
        ADD_FAILURE() << "request " << s.id() << ": no delta within 10 s";
        return {};
      }
      tokens->insert(tokens->end(), d->tokens.begin(), d->tokens.end());
      *text += d->text;
      if (d->finished) return std::move(*d);
    }
  }

  static LlamaModel* model_;
  static Tokenizer* tok_;
};
LlamaModel* EngineLoopTest::model_ = nullptr;
Tokenizer* EngineLoopTest::tok_ = nullptr;

TEST_F(EngineLoopTest, ConcurrentStreamsEqualOfflineOutputs) {
  constexpr int kRequests = 20;
  std::map<RequestId, RequestOutput> offline;
  {
    Engine e(model_, tok_, Config());
    for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(e.AddRequest(Make(i)).ok());
    while (e.HasUnfinished()) {
      for (RequestDelta& d : e.Step()) {
        if (d.finished) offline.emplace(d.id, std::move(d.final));
      }
    }
  }
  Engine engine(model_, tok_, Config());
  EngineLoop loop(&engine);
  std::vector<std::thread> clients;
  std::map<RequestId, std::pair<std::vector<TokenId>, std::string>> got;
  std::map<RequestId, RequestDelta> last;
  std::mutex mu;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = t; i < kRequests; i += 4) {
        auto stream = loop.Submit(Make(i));
        std::vector<TokenId> tokens;
        std::string text;
        RequestDelta end = Drain(*stream, &tokens, &text);
        std::lock_guard<std::mutex> lock(mu);
        got[i] = {tokens, text};
        last[i] = std::move(end);
      }
    });
  }
  for (std::thread& c : clients) c.join();
  ASSERT_EQ(got.size(), static_cast<size_t>(kRequests));
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(got[i].first, offline[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].second, offline[i].text) << "request " << i;
    EXPECT_EQ(last[i].final.finish, FinishReason::kMaxTokens);
    EXPECT_EQ(last[i].final.tokens, offline[i].tokens);
    EXPECT_TRUE(last[i].error.ok());
  }
  const EngineSnapshot s = loop.Snapshot();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
  EXPECT_EQ(s.stats.generated_tokens, int64_t{kRequests} * 48);
}

TEST_F(EngineLoopTest, CancelEndsTheStreamAndFreesItsBlocks) {
  Engine engine(model_, tok_, Config());
  EngineLoop loop(&engine);
  auto stream = loop.Submit(Make(1, 400));
  std::optional<RequestDelta> first = stream->Next(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  ASSERT_FALSE(first->finished);
  EXPECT_GT(loop.Snapshot().kv_blocks_used, 0);
  loop.Cancel(1);
  std::vector<TokenId> tokens = first->tokens;
  std::string text;
  const RequestDelta end = Drain(*stream, &tokens, &text);
  EXPECT_EQ(end.final.finish, FinishReason::kAborted);
  EXPECT_LT(tokens.size(), 400u);
  // The snapshot of the step that returned the aborted request is out before its last delta.
  EXPECT_EQ(loop.Snapshot().kv_blocks_used, 0);
  EXPECT_FALSE(stream->Next(milliseconds(1)).has_value());  // nothing after the last delta
  loop.Cancel(1);   // finished: ignored
  loop.Cancel(99);  // unknown: ignored
  auto after = loop.Submit(Make(2, 4));
  std::vector<TokenId> t2;
  EXPECT_EQ(Drain(*after, &t2, &text).final.finish, FinishReason::kMaxTokens);
  EXPECT_EQ(t2.size(), 4u);
}

TEST_F(EngineLoopTest, RefusalsArriveOnTheStream) {
  Engine engine(model_, tok_, Config());
  EngineLoop loop(&engine);
  Request bad = Make(5);
  bad.prompt.push_back(100000);  // outside the vocabulary
  auto refused = loop.Submit(bad);
  std::optional<RequestDelta> d = refused->Next(milliseconds(10000));
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->finished);
  EXPECT_EQ(d->error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d->error.message().find("100000"), std::string::npos) << d->error;
  // A duplicate of a running request's id is refused; the running one is untouched. It runs 400
  // tokens (~20 ms): 64 (~3 ms) were over in 3-5 of 30 runs before the duplicate arrived, the test's
  // thread waiting for a core while the step's OpenMP threads held both.
  auto running = loop.Submit(Make(6, 400));
  auto duplicate = loop.Submit(Make(6, 400));
  d = duplicate->Next(milliseconds(10000));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->error.code(), absl::StatusCode::kAlreadyExists);
  std::vector<TokenId> tokens;
  std::string text;
  EXPECT_EQ(Drain(*running, &tokens, &text).final.finish, FinishReason::kMaxTokens);
  EXPECT_EQ(tokens.size(), 400u);
}

// A stop string that the tokens complete over several steps: the text of the deltas before the
// last holds back what could be its start (vLLM's hold-back), so the deltas add up to the final
// text (cut before the stop string) and none of them carries any of the stop string.
TEST_F(EngineLoopTest, StopStringSpanningTokensIsNeverPartlyStreamed) {
  const std::string kStop = " girl";  // " g|ir|l" in the greedy text
  Request r;
  r.id = 1;
  r.prompt = tok_->Encode("Once upon a time", true);
  r.max_tokens = 60;
  // Offline and without the stop string: the tokens' text, to check that the stop string starts
  // in one token and ends in a later one (else this test would show nothing).
  std::vector<std::string> pieces;
  {
    Engine e(model_, tok_, Config());
    ASSERT_TRUE(e.AddRequest(r).ok());
    std::vector<RequestOutput> done;
    while (e.HasUnfinished()) {
      for (RequestDelta& d : e.Step()) {
        if (d.finished) done.push_back(std::move(d.final));
      }
    }
    ASSERT_EQ(done.size(), 1u);
    TokenId prev = r.prompt.back();
    for (TokenId t : done[0].tokens) {
      pieces.push_back(tok_->DecodeToken(prev, t));
      prev = t;
    }
  }
  std::string text;
  std::vector<size_t> ends;  // the text's length after each piece
  for (const std::string& p : pieces) ends.push_back((text += p).size());
  const size_t at = text.find(kStop);
  ASSERT_NE(at, std::string::npos) << text;
  // The pieces holding the stop string's first and last byte.
  const size_t first_piece = std::upper_bound(ends.begin(), ends.end(), at) - ends.begin();
  const size_t last_piece = std::lower_bound(ends.begin(), ends.end(), at + kStop.size()) - ends.begin();
  ASSERT_GT(last_piece, first_piece) << "'" << kStop << "' is one token here: pick a stop string that spans tokens "
                                     << "in '" << absl::StrJoin(pieces, "|") << "'";
  const std::string expected = text.substr(0, text.find(kStop));

  Engine engine(model_, tok_, Config());
  EngineLoop loop(&engine);
  r.stop_strings = {"zzzz", kStop};  // the longest sets the hold-back
  auto stream = loop.Submit(r);
  std::string streamed;
  int text_deltas = 0;
  for (;;) {
    std::optional<RequestDelta> d = stream->Next(milliseconds(10000));
    ASSERT_TRUE(d.has_value());
    streamed += d->text;
    EXPECT_EQ(expected.compare(0, streamed.size(), streamed), 0) << "streamed '" << streamed << "'";
    text_deltas += !d->text.empty();
    if (d->finished) {
      EXPECT_EQ(d->final.finish, FinishReason::kStopString);
      EXPECT_EQ(d->final.text, expected);
      break;
    }
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_GT(text_deltas, 1) << "streamed in one piece";
}

TEST_F(EngineLoopTest, StoppingEndsRunningRequests) {
  Engine engine(model_, tok_, Config());
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    EngineLoop loop(&engine);
    for (int i = 0; i < 4; ++i) streams.push_back(loop.Submit(Make(i, 400)));
    ASSERT_TRUE(streams[0]->Next(milliseconds(10000)).has_value());
  }  // the loop stops here
  for (auto& s : streams) {
    std::vector<TokenId> tokens;
    std::string text;
    EXPECT_EQ(Drain(*s, &tokens, &text).final.finish, FinishReason::kAborted) << "request " << s->id();
  }
  EXPECT_FALSE(engine.HasUnfinished());
  EXPECT_EQ(engine.scheduler().blocks().num_available(), engine.scheduler().blocks().num_blocks());
}

// POST /reset_prefix_cache's side of the loop: the reset runs between two steps and forgets the
// finished requests' cached blocks, so the same prompt is computed again; a request running through
// it keeps its blocks and goes on; calls from several threads at once all return; after Stop, a call
// is refused at once.
TEST_F(EngineLoopTest, ResetPrefixCacheRunsBetweenSteps) {
  Engine engine(model_, tok_, Config());
  EngineLoop loop(&engine);
  auto run = [&](RequestId id, int32_t max_tokens) {
    Request r = Make(id, max_tokens);
    r.prompt = tok_->Encode("Once upon a time there was a little girl named Lily. She loved to play in the park "
                            "with her dog and her friends every day.", true);
    std::vector<TokenId> tokens;
    std::string text;
    return Drain(*loop.Submit(std::move(r)), &tokens, &text).final;
  };
  EXPECT_EQ(run(1, 4).cached_prompt_tokens, 0);
  const RequestOutput hit = run(2, 4);
  ASSERT_GE(hit.cached_prompt_tokens, 32);
  auto running = loop.Submit(Make(3, 400));
  ASSERT_TRUE(running->Next(milliseconds(10000)).has_value());
  absl::StatusOr<int32_t> blocks = loop.ResetPrefixCache(milliseconds(10000));
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_GE(*blocks, hit.cached_prompt_tokens / 16);
  EXPECT_EQ(run(4, 4).cached_prompt_tokens, 0);
  std::vector<std::thread> callers;
  std::vector<absl::Status> results(4);
  for (size_t i = 0; i < results.size(); ++i) {
    callers.emplace_back([&, i] { results[i] = loop.ResetPrefixCache(milliseconds(10000)).status(); });
  }
  for (std::thread& t : callers) t.join();
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  std::vector<TokenId> tokens;
  std::string text;
  const RequestDelta end = Drain(*running, &tokens, &text);
  EXPECT_EQ(end.final.finish, FinishReason::kMaxTokens);
  EXPECT_EQ(end.final.tokens.size(), 400u);
  loop.Stop();
  EXPECT_EQ(loop.ResetPrefixCache(milliseconds(10000)).status().code(), absl::StatusCode::kUnavailable);
}

// A switch (a model reload) between steps: the request running keeps its engine to its end, the
// next one runs on the new engine, and the old engine is let go once its last request has ended.
TEST_F(EngineLoopTest, SwitchKeepsRunningRequestsOnTheirEngine) {
  std::atomic<bool> old_released{false};
  auto old_engine = std::shared_ptr<Engine>(new Engine(model_, tok_, Config(256)), [&](Engine* e) {
    delete e;
    old_released = true;
  });
  EngineLoop loop(std::move(old_engine));
  auto running = loop.Submit(Make(1, 200));
  std::optional<RequestDelta> first = running->Next(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  ASSERT_FALSE(first->finished);
  ASSERT_TRUE(loop.Switch(std::make_shared<Engine>(model_, tok_, Config(128)), milliseconds(10000)).ok());
  EXPECT_FALSE(old_released);  // its request still runs there
  auto next = loop.Submit(Make(2, 8));
  std::vector<TokenId> tokens = first->tokens, t2;
  std::string text;
  EXPECT_EQ(Drain(*running, &tokens, &text).final.finish, FinishReason::kMaxTokens);
  EXPECT_EQ(tokens.size(), 200u);
  EXPECT_EQ(Drain(*next, &t2, &text).final.finish, FinishReason::kMaxTokens);
  EXPECT_EQ(t2.size(), 8u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!old_released && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(old_released);
  EXPECT_EQ(loop.Snapshot().kv_blocks_total, 128);  // the new engine's pool is the one reported
  EXPECT_EQ(loop.Snapshot().kv_blocks_used, 0);
}

}  // namespace
}  // namespace specula
