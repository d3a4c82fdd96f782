// Tensor parallelism in one process: the shard plans (heads, replicated KV heads, hidden units,
// vocabulary, refusals), the step messages, and a TP = 2 forward (two threads, each a rank with its
// own shard, over an in-process communicator) against TP = 1 on the same weights.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "dist/communicator.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama_model.h"
#include "model/make_model.h"
#include "model/tensor_parallel.h"
#include "tests/test_util.h"

namespace specula {
namespace {

ModelConfig Heads(int32_t heads, int32_t kv_heads, int32_t head_dim = 64, int32_t hidden = 1536) {
  ModelConfig c;
  c.dim = heads * head_dim;
  c.hidden_dim = hidden;
  c.num_layers = 1;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = 49152;
  c.max_seq_len = 128;
  return c;
}

TEST(TpPlanTest, SplitsHeadsHiddenAndVocabulary) {
  struct Row {
    int32_t heads, kv, tp, rank;
    int32_t q0, q1, own0, own1, kv0, kv1;
  };
  const Row rows[] = {
      {9, 3, 3, 1, 3, 6, 3, 6, 1, 2},   // smollm2 at TP 3: one KV head each
      {9, 3, 2, 0, 0, 6, 0, 4, 0, 2},   // TP 2: heads 0-3 owned; KV head 1 whole (heads 3-5)
      {9, 3, 2, 1, 3, 9, 4, 9, 1, 3},   //       heads 4-8 owned; KV head 1 replicated
      {8, 2, 4, 3, 6, 8, 6, 8, 1, 2},   // TP above the KV heads: vLLM's replication, compact
      {8, 8, 2, 1, 4, 8, 4, 8, 4, 8},   // MHA
      {6, 6, 3, 2, 4, 6, 4, 6, 4, 6},   // stories15m at TP 3
  };
  for (const Row& r : rows) {
    auto s = PlanShard(Heads(r.heads, r.kv), r.tp, r.rank);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(std::vector<int32_t>({s->q_begin, s->q_end, s->own_begin, s->own_end, s->kv_begin, s->kv_end}),
              std::vector<int32_t>({r.q0, r.q1, r.own0, r.own1, r.kv0, r.kv1}))
        << r.heads << "/" << r.kv << " heads, TP " << r.tp << " rank " << r.rank;
  }
  auto s = PlanShard(Heads(9, 3), 3, 2, QuantType::kQ4_1, QuantType::kQ4_1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->hidden_begin, 1024);  // 48 blocks of 32 over 3 ranks
  EXPECT_EQ(s->hidden_end, 1536);
  EXPECT_EQ(s->vocab_begin, 32768);
  EXPECT_EQ(s->vocab_end, 49152);
}

TEST(TpPlanTest, RefusesWithTheNumbers) {
  auto too_many = PlanShard(Heads(9, 3), 10, 0);
  EXPECT_EQ(too_many.status().message(), "--tensor-parallel-size 10 exceeds the model's 9 attention heads: every rank needs at least one");
  auto k_blocks = PlanShard(Heads(9, 3), 2, 0, QuantType::kQ4_K);
  EXPECT_EQ(k_blocks.status().message(),
            "--tensor-parallel-size 2: o_proj is Q4_K (blocks of 256) and head_dim 64 does not cut on a block boundary");
  auto hidden = PlanShard(Heads(4, 4, 64, 512), 3, 0, QuantType::kF32, QuantType::kQ6_K);
  EXPECT_NE(hidden.status().message().find("512 hidden units in blocks of 256"), std::string::npos) << hidden.status();
}

TEST(TpMessageTest, RoundTripsAndRejectsCorruptBytes) {
  std::vector<TokenId> t0 = {1, 2, 3}, t1 = {9};
  std::vector<BlockId> b0 = {4}, b1 = {5, 6};
  ForwardBatch batch;
  batch.seqs.push_back({t0, 0, b0, false});
  batch.seqs.push_back({t1, 17, b1, true});
  StepMessage m = ForwardMessage(batch);
  m.pool_id = 77;
  m.block_size = 16;
  m.num_blocks = 100;
  m.kv_dtype = DType::kBF16;
  m.released_pools = {3, 4};
  const std::string bytes = EncodeStepMessage(m);
  StepMessage back;
  ASSERT_TRUE(DecodeStepMessage(bytes, &back).ok());
  EXPECT_EQ(back.pool_id, 77u);
  EXPECT_EQ(back.released_pools, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(back.kv_dtype, DType::kBF16);
  const ForwardBatch b = back.Batch();
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(std::vector<TokenId>(b.seqs[0].tokens.begin(), b.seqs[0].tokens.end()), t0);
  EXPECT_EQ(b.seqs[1].start_pos, 17);
  EXPECT_TRUE(b.seqs[1].all_logits);
  EXPECT_EQ(std::vector<BlockId>(b.seqs[1].block_table.begin(), b.seqs[1].block_table.end()), b1);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(DecodeStepMessage(bytes.substr(0, cut), &back).ok()) << cut;
  }
  EXPECT_FALSE(DecodeStepMessage(bytes + "x", &back).ok());
}

// N ranks as threads: each collective is a rendezvous over shared slots, summed in rank order.
class ThreadGroup {
 public:
  explicit ThreadGroup(int32_t n) : n_(n), slots_(n) {}

  class Rank final : public Communicator {
   public:
    Rank(ThreadGroup* g, int32_t r) : g_(g), r_(r) {}
    const char* name() const override { return "threads"; }
    int32_t rank() const override { return r_; }
    int32_t size() const override { return g_->n_; }
    double timeout_s() const override { return 0; }
    absl::Status AllReduceSum(void* data, int64_t count, DType, absl::string_view) override {
      g_->Put(r_, data);
      std::vector<float> sum(count, 0.0f);  // [count]
      for (int32_t i = 0; i < g_->n_; ++i) {
        const float* x = static_cast<const float*>(g_->slots_[i]);
        for (int64_t j = 0; j < count; ++j) sum[j] += x[j];
      }
      g_->Wait();
      std::memcpy(data, sum.data(), count * sizeof(float));
      g_->Wait();
      return absl::OkStatus();
    }
    absl::Status AllGather(const void* send, size_t bytes, void* recv, absl::string_view) override {
      g_->Put(r_, const_cast<void*>(send));
      for (int32_t i = 0; i < g_->n_; ++i) std::memcpy(static_cast<char*>(recv) + i * bytes, g_->slots_[i], bytes);
      g_->Wait();
      return absl::OkStatus();
    }
    absl::Status Broadcast(void* data, size_t bytes, int32_t root, absl::string_view) override {
      g_->Put(r_, data);
      if (r_ != root) std::memcpy(data, g_->slots_[root], bytes);
      g_->Wait();
      return absl::OkStatus();
    }
    absl::Status Barrier(absl::string_view) override {
      g_->Wait();
      return absl::OkStatus();
    }
    absl::Status BroadcastMessage(std::string* msg, absl::string_view) override {
      g_->Put(r_, msg);
      if (r_ != 0) *msg = *static_cast<std::string*>(g_->slots_[0]);
      g_->Wait();
      return absl::OkStatus();
    }

   private:
    ThreadGroup* g_;
    int32_t r_;
  };

 private:
  // Publishes this rank's pointer and waits for everyone's.
  void Put(int32_t r, void* p) {
    slots_[r] = p;
    Wait();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

  int32_t n_;
  std::vector<void*> slots_;  // [n] each rank's buffer during a collective
  std::mutex mu_;
  std::condition_variable cv_;
  int32_t arrived_ = 0;
  int64_t gen_ = 0;
};

// Greedy tokens and the first step's logits of a 2-sequence batch over 12 steps.
std::vector<float> RunBatch(LlamaModel& m, std::vector<TokenId>* greedy) {
  const ModelConfig& c = m.config();
  KvCache kv(c, {16, 8, DType::kF32}, &m.backend());
  std::vector<std::vector<TokenId>> seqs = {{1, 5, 9, 2, 7}, {3, 3, 8}};
  std::vector<std::vector<BlockId>> tables = {{0, 1, 2}, {3, 4, 5}};
  std::vector<int32_t> pos = {0, 0};
  std::vector<float> first, logits;
  for (int step = 0; step < 12; ++step) {
    ForwardBatch b;
    std::vector<std::vector<TokenId>> news(2);
    for (int s = 0; s < 2; ++s) {
      news[s] = step == 0 ? seqs[s] : std::vector<TokenId>{seqs[s].back()};
      b.seqs.push_back({news[s], pos[s], tables[s], false});
    }
    EXPECT_TRUE(m.Forward(b, kv, LogitsMode::kLastPerSequence, &logits).ok());
    if (step == 0) first = logits;
    for (int s = 0; s < 2; ++s) {
      pos[s] += static_cast<int32_t>(news[s].size());
      const float* row = logits.data() + static_cast<size_t>(s) * c.vocab_size;
      const TokenId t = static_cast<TokenId>(std::max_element(row, row + c.vocab_size) - row);
      seqs[s].push_back(t);
      greedy->push_back(t);
    }
  }
  return first;
}

TEST(TpForwardTest, TwoRanksGiveTheLogitsAndTokensOfOne) {
  const std::string dir = testing::MakeTempDir();
  // 9 heads over 3 KV heads (smollm2's layout): TP 2 replicates a KV head and zeroes foreign heads.
  ModelConfig c = Heads(9, 3, 16, 96);
  c.num_layers = 2;
  c.vocab_size = 301;  // not a multiple of 2: the last rank's slice is shorter
  c.max_seq_len = 64;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  ASSERT_TRUE(WriteRandomModel(c, dir, DType::kF32, 5).ok());

  std::vector<TokenId> want_tokens;
  auto one = LlamaModel::Create(*LoadHfModel(dir), MakeCpuBackend());
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<float> want = RunBatch(**one, &want_tokens);

  ThreadGroup group(2);
  std::vector<TokenId> got_tokens;
  std::vector<float> got;
  absl::Status follower;
  std::thread rank1([&] {
    auto w = *LoadHfModel(dir);
    follower = ShardWeights(*w, *PlanShard(c, 2, 1));
    if (!follower.ok()) return;
    auto m = LlamaModel::Create(std::move(w), MakeCpuBackend(), std::make_shared<ThreadGroup::Rank>(&group, 1));
    follower = m.ok() ? (*m)->RunFollower() : m.status();
  });
  {
    auto w = *LoadHfModel(dir);
    ASSERT_TRUE(ShardWeights(*w, *PlanShard(c, 2, 0)).ok());
    EXPECT_EQ(w->config.num_heads, 6);  // heads 0-5 computed, 0-3 owned
    EXPECT_EQ(w->config.num_kv_heads, 2);
    auto m = LlamaModel::Create(std::move(w), MakeCpuBackend(), std::make_shared<ThreadGroup::Rank>(&group, 0));
    ASSERT_TRUE(m.ok()) << m.status();
    got = RunBatch(**m, &got_tokens);
  }  // rank 0's model stops rank 1
  rank1.join();
  EXPECT_TRUE(follower.ok()) << follower;
  ASSERT_EQ(got.size(), want.size());
  float max_err = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, std::abs(got[i] - want[i]));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  EXPECT_LT(max_err, 1e-5f * max_ref);  // the sums of o_proj and down only change order
  EXPECT_EQ(got_tokens, want_tokens);
}

}  // namespace
}  // namespace specula
