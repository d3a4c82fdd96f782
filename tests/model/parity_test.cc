// Parity with an independent numpy reference (tests/reference/llama_ref.py) on random HF models
// covering GQA, QKV bias, tied and untied classifiers, both RoPE conventions, Llama-3 rope scaling,
// f32/f16/bf16 weights, f32 and bf16 KV caches (the reference rounds K and V the same way), and
// prompts of 1 to 300 tokens fed in chunks through the paged cache.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_join.h"
#include "model/llama_model.h"
#include "model/make_model.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace specula {
namespace {

struct ParityCase {
  const char* name;
  int32_t heads, kv_heads;
  bool qkv_bias, tied, interleaved, llama3_scaling;
  DType dtype;
  DType kv_dtype = DType::kF32;
};

class ParityTest : public ::testing::TestWithParam<ParityCase> {};

double g_worst_error = 0.0;

TEST_P(ParityTest, LogitsMatchNumpyReference) {
  const ParityCase& pc = GetParam();
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 96;
  c.num_layers = 2;
  c.num_heads = pc.heads;
  c.num_kv_heads = pc.kv_heads;
  c.head_dim = c.dim / c.num_heads;
  c.vocab_size = 97;
  c.max_seq_len = 512;
  c.rope_theta = pc.qkv_bias ? 1e6f : 10000.0f;
  c.qkv_bias = pc.qkv_bias;
  c.tie_embeddings = pc.tied;
  c.rope_interleaved = pc.interleaved;
  if (pc.llama3_scaling) c.rope_scaling = {"llama3", 8.0f, 1.0f, 4.0f, 64};
  const std::string dir = testing::MakeTempDir();
  ASSERT_TRUE(WriteRandomModel(c, dir, pc.dtype, /*seed=*/7).ok());
  auto weights = LoadModel(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  LlamaModel model(std::move(weights).value(), MakeCpuBackend());

  for (int32_t len : {1, 2, 17, 64, 300}) {
    std::vector<TokenId> ids(len);  // [len]
    for (int32_t i = 0; i < len; ++i) ids[i] = (i * 31 + len * 7 + 3) % c.vocab_size;
    // Engine: prompt fed in chunks of 37 tokens through a 16-slot paged cache.
    KvCache kv(c, {16, 0, pc.kv_dtype});
    BlockAllocator alloc(kv.num_blocks());
    SequenceBlocks blocks(&alloc, 16);
    std::vector<float> got;  // [len, vocab]
    std::vector<float> step;
    for (int32_t pos = 0; pos < len; pos += 37) {
      const int32_t n = std::min(37, len - pos);
      ASSERT_TRUE(blocks.Reserve(pos + n).ok());
      ForwardBatch batch;
      batch.seqs.push_back({absl::MakeConstSpan(ids).subspan(pos, n), pos, blocks.table()});
      ASSERT_TRUE(model.Forward(batch, kv, LogitsMode::kAll, &step).ok());
      got.insert(got.end(), step.begin(), step.end());
    }
    // Reference.
    const std::string out = dir + "/ref_logits.f32";
    const std::string cmd = absl::StrCat("python3 ", SPECULA_SOURCE_DIR, "/tests/reference/llama_ref.py --model ",
                                         dir, " --ids ", absl::StrJoin(ids, ","), " --out ", out,
                                         pc.kv_dtype == DType::kBF16 ? " --kv-bf16" : "");
    ASSERT_EQ(testing::RunCommand(cmd), 0) << cmd;
    std::vector<float> want(got.size());
    std::ifstream in(out, std::ios::binary);
    in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
    ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(want.size() * 4));
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "NaN at " << i;
      max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - want[i]));
      max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
    }
    const double rel = max_diff / max_ref;
    g_worst_error = std::max(g_worst_error, rel);
    // A bf16 KV cache rounds K and V as the reference does, but a float32 difference of one ulp in
    // the product that feeds a rounding can move that element by a whole bf16 ulp (2^-8): the
    // AVX2 build's different accumulation order put len 300 at 2.8e-4 (AVX-512: 6e-6). Without
    // the reference's rounding the error is 2.5e-3 to 6.9e-3, so 1e-3 still tells them apart.
    EXPECT_LT(rel, pc.kv_dtype == DType::kBF16 ? 1e-3 : 1e-4) << pc.name << " len " << len;
    std::printf("[parity] %-24s len %3d  max|diff|/max|ref| = %.3g\n", pc.name, len, rel);
  }
  std::printf("[parity] worst relative error so far: %.3g\n", g_worst_error);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ParityTest,
    ::testing::Values(
        ParityCase{"gqa_halves_untied", 8, 2, false, false, false, false, DType::kF32},
        ParityCase{"mha_interleaved_tied", 4, 4, false, true, true, false, DType::kF32},
        ParityCase{"qkv_bias_gqa_tied_f16", 4, 2, true, true, false, false, DType::kF16},
        ParityCase{"llama3_scaling_bf16", 8, 4, false, false, false, true, DType::kBF16},
        ParityCase{"mqa_bias_interleaved", 8, 1, true, false, true, false, DType::kF32},
        ParityCase{"gqa_kv_bf16", 8, 2, false, false, false, false, DType::kF32, DType::kBF16},
        ParityCase{"mha_interleaved_kv_bf16", 4, 4, true, true, true, false, DType::kBF16, DType::kBF16}),
    [](const ::testing::TestParamInfo<ParityCase>& i) { return i.param.name; });

}  // namespace
}  // namespace specula
