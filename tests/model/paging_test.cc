// The paged KV cache: block sizes do not change results, batching does not change results, and a
// watermark cut followed by re-feeding reproduces the logits.
#include <map>

#include "tests/one_sequence.h"
#include "tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace specula {
namespace {

class PagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::TinyStoriesDir();
    auto weights = LoadModel(dir + "/stories260K.bin");
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(tok).value();
    model_ = std::make_unique<LlamaModel>(std::move(weights).value(), MakeCpuBackend());
  }

  std::vector<TokenId> Alone(const std::vector<TokenId>& prompt, int32_t max_tokens, int32_t bs) {
    GenerateOptions opt;
    opt.max_tokens = max_tokens;
    opt.block_size = bs;
    auto r = Generate(*model_, prompt, opt);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<TokenId>{};
  }

  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(PagingTest, BlockSizesGiveIdenticalTokens) {
  const auto prompt = tok_->Encode("The little dog ran to the park and", true);
  const auto b16 = Alone(prompt, 150, 16);
  ASSERT_EQ(b16.size(), 150u);
  EXPECT_EQ(Alone(prompt, 150, 1), b16);
  EXPECT_EQ(Alone(prompt, 150, 64), b16);
  EXPECT_EQ(Alone(prompt, 150, 7), b16);  // a block size that divides nothing
}

// Sequences join at different steps (prefill mixed with decodes), with different prompt lengths
// and output lengths, sharing one pool whose blocks are handed out interleaved.
TEST_F(PagingTest, BatchOfDifferentSequencesEqualsEachAlone) {
  const std::vector<std::string> texts = {"Once upon a time", "The cat", "Tom and his mom went to the store to buy",
                                          "One day", "A big red ball rolled down the hill and the girl", "Sue"};
  const int32_t bs = 16;
  KvCache kv(model_->config(), {bs, 256});
  BlockAllocator alloc(kv.num_blocks());
  struct Seq {
    std::vector<TokenId> tokens;  // prompt + generated
    int32_t prompt_len, max_new, start_step;
    int32_t computed = 0;          // tokens whose KV is cached
    std::unique_ptr<SequenceBlocks> blocks;
    std::vector<TokenId> generated;
  };
  std::vector<Seq> seqs;
  for (size_t i = 0; i < texts.size(); ++i) {
    Seq s;
    s.tokens = tok_->Encode(texts[i], true);
    s.prompt_len = static_cast<int32_t>(s.tokens.size());
    s.max_new = 20 + 13 * static_cast<int32_t>(i);
    s.start_step = 3 * static_cast<int32_t>(i);
    s.blocks = std::make_unique<SequenceBlocks>(&alloc, bs);
    seqs.push_back(std::move(s));
  }
  std::vector<float> logits;
  for (int32_t step = 0;; ++step) {
    ForwardBatch batch;
    std::vector<Seq*> order;
    for (Seq& s : seqs) {
      if (step < s.start_step || static_cast<int32_t>(s.generated.size()) >= s.max_new) continue;
      const int32_t n = static_cast<int32_t>(s.tokens.size()) - s.computed;
      ASSERT_TRUE(s.blocks->Reserve(s.computed + n).ok());
      batch.seqs.push_back({absl::MakeConstSpan(s.tokens).subspan(s.computed, n), s.computed, s.blocks->table()});
      order.push_back(&s);
    }
    if (batch.seqs.empty()) {
      bool all_done = true;
      for (Seq& s : seqs) all_done &= static_cast<int32_t>(s.generated.size()) >= s.max_new;
      if (all_done) break;
      continue;
    }
    ASSERT_TRUE(model_->Forward(batch, kv, LogitsMode::kLastPerSequence, &logits).ok());
    const int32_t vocab = model_->config().vocab_size;
    for (size_t i = 0; i < order.size(); ++i) {
      Seq& s = *order[i];
      const float* row = logits.data() + i * vocab;
      const TokenId next = static_cast<TokenId>(std::max_element(row, row + vocab) - row);
      s.computed = static_cast<int32_t>(s.tokens.size());
      s.tokens.push_back(next);
      s.generated.push_back(next);
    }
  }
  for (Seq& s : seqs) {
    const std::vector<TokenId> prompt(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
    EXPECT_EQ(s.generated, Alone(prompt, s.max_new, bs));
  }
}

TEST_F(PagingTest, CutBackAndRefeedGivesSameLogits) {
  const auto tokens = tok_->Encode("Lily and Ben played with a big box in the garden all day long", true);
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t vocab = model_->config().vocab_size;
  KvCache kv(model_->config(), {4, 64});
  BlockAllocator alloc(kv.num_blocks());
  SequenceBlocks blocks(&alloc, 4);
  ASSERT_TRUE(blocks.Reserve(n).ok());
  std::vector<float> first, again;
  ForwardBatch all;
  all.seqs.push_back({tokens, 0, blocks.table()});
  ASSERT_TRUE(model_->Forward(all, kv, LogitsMode::kAll, &first).ok());

  // Overwrite positions [cut, n) with other tokens (as rejected drafts would), cut back, re-feed.
  const int32_t cut = 5;
  std::vector<TokenId> junk(tokens.begin() + cut, tokens.end());
  for (TokenId& t : junk) t = (t * 7 + 11) % vocab;
  ForwardBatch wrong;
  wrong.seqs.push_back({junk, cut, blocks.table()});
  ASSERT_TRUE(model_->Forward(wrong, kv, LogitsMode::kAll, &again).ok());
  blocks.Truncate(cut);  // blocks past the watermark go back to the pool
  EXPECT_EQ(blocks.table().size(), 2u);
  ASSERT_TRUE(blocks.Reserve(n).ok());
  ForwardBatch refeed;
  refeed.seqs.push_back({absl::MakeConstSpan(tokens).subspan(cut), cut, blocks.table()});
  ASSERT_TRUE(model_->Forward(refeed, kv, LogitsMode::kAll, &again).ok());
  ASSERT_EQ(again.size(), static_cast<size_t>(n - cut) * vocab);
  for (int32_t i = 0; i < (n - cut) * vocab; ++i) {
    ASSERT_NEAR(again[i], first[cut * vocab + i], 1e-4f * (1.0f + std::abs(first[cut * vocab + i])))
        << "row " << cut + i / vocab;
  }
}

TEST_F(PagingTest, ForwardRejectsBadBatchWithoutTouchingCache) {
  KvCache kv(model_->config(), {16, 4});
  std::vector<BlockId> table = {0};
  std::vector<TokenId> bad_token = {1, 9999};
  std::vector<float> logits;
  ForwardBatch b1;
  b1.seqs.push_back({bad_token, 0, table});
  auto st = model_->Forward(b1, kv, LogitsMode::kAll, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token id 9999"), std::string::npos) << st;
  std::vector<TokenId> many(20, 5);
  ForwardBatch b2;
  b2.seqs.push_back({many, 0, table});  // 20 tokens, one block of 16
  st = model_->Forward(b2, kv, LogitsMode::kAll, &logits);
  EXPECT_NE(st.message().find("block table"), std::string::npos) << st;
  std::vector<BlockId> outside = {0, 17};
  ForwardBatch b3;
  b3.seqs.push_back({many, 0, outside});
  st = model_->Forward(b3, kv, LogitsMode::kAll, &logits);
  EXPECT_NE(st.message().find("block id 17"), std::string::npos) << st;
}

}  // namespace
}  // namespace specula
