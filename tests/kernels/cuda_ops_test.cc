// Differential tests of every CUDA op against the CPU reference backend (label `gpu`): fresh
// random inputs of several shapes (odd sizes, several block sizes), outputs poisoned with NaN
// before each run, relative-error bounds per dtype; NaN never passes. Skipped without a GPU.
#include <algorithm>
#include <numeric>

#include "core/categorical.h"
#include "model/sampler.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/gpu_util.h"

namespace specula {
namespace {

using testing::ExpectClose;
using testing::FromBackend;
using testing::Quantize;
using testing::RandomVec;
using testing::RawFromBackend;
using testing::RawToBackend;
using testing::ToBackend;
using testing::Tolerance;

class CudaOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    SPECULA_REQUIRE_GPU();
    cpu_ = MakeCpuBackend();
    auto gpu = MakeBackend({"cuda", DTypeName(GetParam())});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(gpu).value();
  }
  DType dt() const { return GetParam(); }
  // Random values already rounded to the dtype under test.
  std::vector<float> In(int64_t n, float scale = 1.0f) { return Quantize(RandomVec(n, ++seed_, scale), dt()); }

  std::unique_ptr<Backend> cpu_, gpu_;
  uint64_t seed_ = 1000;
};

TEST_P(CudaOpsTest, LinearWithAndWithoutBias) {
  for (auto [m, n, k] : std::vector<std::array<int32_t, 3>>{{1, 7, 5}, {3, 33, 64}, {17, 100, 96}, {64, 256, 128}, {5, 1000, 288}, {1, 2048, 2048}, {2, 515, 1024}, {4, 37, 8200}, {4, 64, 24}}) {
    const auto x = In(int64_t{m} * k), w = In(int64_t{n} * k, 0.2f), b = In(n);
    for (bool bias : {false, true}) {
      auto run = [&](Backend& be) {
        auto xd = ToBackend(be, x), wd = ToBackend(be, w), bd = ToBackend(be, b);
        testing::DevTensor y(be, int64_t{m} * n, DTypeBytes(be.dtype()));
        be.Linear(xd->get(), wd->get(), bias ? bd->get() : nullptr, m, n, k, y.get());
        return FromBackend(be, y.get(), int64_t{m} * n);
      };
      ExpectClose(run(*cpu_), run(*gpu_), Tolerance(dt()), absl::StrCat("Linear m=", m, " n=", n, " k=", k, " bias=", bias));
    }
    auto run_f32 = [&](Backend& be) {
      auto xd = ToBackend(be, x), wd = ToBackend(be, w);
      testing::DevTensor y(be, int64_t{m} * n, sizeof(float));
      be.LinearF32(xd->get(), wd->get(), m, n, k, y.as<float>());
      return FromBackend(be, y.get(), int64_t{m} * n, /*f32=*/true);
    };
    // float32 output: only the accumulation order differs.
    ExpectClose(run_f32(*cpu_), run_f32(*gpu_), 2e-5, absl::StrCat("LinearF32 m=", m, " n=", n, " k=", k));
  }
}

// m <= 4 runs the outputs in one fused matrix-vector launch on the GPU; m = 9 through cuBLAS.
TEST_P(CudaOpsTest, MultiLinear) {
  for (int32_t m : {9, 1, 3}) {
    const int32_t k = 48;
    const auto x = In(m * k), w0 = In(40 * k, 0.2f), w1 = In(24 * k, 0.2f), w2 = In(17 * k, 0.2f), b1 = In(24);
    auto run = [&](Backend& be) {
      auto xd = ToBackend(be, x), w0d = ToBackend(be, w0), w1d = ToBackend(be, w1), w2d = ToBackend(be, w2),
           b1d = ToBackend(be, b1);
      testing::DevTensor y0(be, m * 40, DTypeBytes(be.dtype())), y1(be, m * 24, DTypeBytes(be.dtype())),
          y2(be, m * 17, DTypeBytes(be.dtype()));
      const Backend::LinearOut outs[] = {{w0d->get(), nullptr, 40, y0.get()},
                                         {w1d->get(), b1d->get(), 24, y1.get()},
                                         {w2d->get(), nullptr, 17, y2.get()}};
      be.MultiLinear(xd->get(), m, k, outs, 3);
      auto a = FromBackend(be, y0.get(), m * 40), b = FromBackend(be, y1.get(), m * 24),
           c = FromBackend(be, y2.get(), m * 17);
      a.insert(a.end(), b.begin(), b.end());
      a.insert(a.end(), c.begin(), c.end());
      return a;
    };
    ExpectClose(run(*cpu_), run(*gpu_), Tolerance(dt()), absl::StrCat("MultiLinear m=", m));
  }
}

TEST_P(CudaOpsTest, RmsNormAndFusedResidual) {
  for (auto [m, d] : std::vector<std::array<int32_t, 2>>{{1, 8}, {5, 100}, {33, 4096}, {2, 2049}}) {
    const auto x = In(int64_t{m} * d), delta = In(int64_t{m} * d), w = In(d);
    auto run = [&](Backend& be, bool fused) {
      auto xd = ToBackend(be, x), dd = ToBackend(be, delta), wd = ToBackend(be, w);
      testing::DevTensor y(be, int64_t{m} * d, DTypeBytes(be.dtype()));
      if (fused) {
        be.AddRmsNorm(xd->get(), dd->get(), wd->get(), m, d, 1e-5f, y.get());
      } else {
        be.RmsNorm(xd->get(), wd->get(), m, d, 1e-5f, y.get());
      }
      auto out = FromBackend(be, y.get(), int64_t{m} * d);
      const auto xs = FromBackend(be, xd->get(), int64_t{m} * d);  // the updated residual
      out.insert(out.end(), xs.begin(), xs.end());
      return out;
    };
    for (bool fused : {false, true}) {
      ExpectClose(run(*cpu_, fused), run(*gpu_, fused), Tolerance(dt()),
                  absl::StrCat(fused ? "AddRmsNorm" : "RmsNorm", " m=", m, " d=", d));
    }
  }
}

TEST_P(CudaOpsTest, RopeBothConventions) {
  for (auto [m, heads, hd] : std::vector<std::array<int32_t, 3>>{{1, 3, 8}, {7, 4, 64}, {20, 2, 128}, {3, 5, 80}}) {
    const int32_t max_pos = 300;
    const auto cos_sin = RandomVec(int64_t{max_pos} * hd, ++seed_);  // any values: the op only applies them
    std::vector<int32_t> pos(m);
    for (int32_t i = 0; i < m; ++i) pos[i] = (i * 37 + 11) % max_pos;
    const auto x = In(int64_t{m} * heads * hd);
    for (bool interleaved : {false, true}) {
      auto run = [&](Backend& be) {
        auto xd = ToBackend(be, x);
        auto cs = RawToBackend(be, cos_sin);
        auto pd = RawToBackend(be, pos);
        be.Rope(xd->get(), pd->as<int32_t>(), m, heads, RopeParams{hd, interleaved, cs->as<float>()});
        return FromBackend(be, xd->get(), int64_t{m} * heads * hd);
      };
      ExpectClose(run(*cpu_), run(*gpu_), Tolerance(dt()) * 2,
                  absl::StrCat("Rope m=", m, " heads=", heads, " hd=", hd, " interleaved=", interleaved));
    }
  }
}

TEST_P(CudaOpsTest, SiluMulAddAndGather) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    const auto g = In(n, 4.0f), u = In(n);
    auto run = [&](Backend& be) {
      auto gd = ToBackend(be, g), ud = ToBackend(be, u);
      testing::DevTensor out(be, n, DTypeBytes(be.dtype()));
      be.SiluMul(gd->get(), ud->get(), n, out.get());
      auto a = FromBackend(be, out.get(), n);
      be.Add(gd->get(), ud->get(), n);
      auto b = FromBackend(be, gd->get(), n);
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    ExpectClose(run(*cpu_), run(*gpu_), Tolerance(dt()), absl::StrCat("SiluMul/Add n=", n));
  }
  const int32_t vocab = 301, d = 72, m = 13;
  const auto table = In(int64_t{vocab} * d);
  std::vector<int32_t> ids(m);
  for (int32_t i = 0; i < m; ++i) ids[i] = (i * 97 + 5) % vocab;
  auto run = [&](Backend& be) {
    auto td = ToBackend(be, table);
    auto idd = RawToBackend(be, ids);
    testing::DevTensor out(be, int64_t{m} * d, DTypeBytes(be.dtype()));
    be.EmbeddingGather(td->get(), d, idd->as<int32_t>(), m, out.get());
    return FromBackend(be, out.get(), int64_t{m} * d);
  };
  ExpectClose(run(*cpu_), run(*gpu_), 0.0, "EmbeddingGather");  // a copy: exact
}

// A paged-attention scenario: each sequence has `ctx` cached positions, the last `fresh` of them
// new in this step. Blocks are handed out in a shuffled order.
struct AttnCase {
  int32_t block_size, heads, kv_heads, head_dim;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (ctx, fresh)
};

TEST_P(CudaOpsTest, KvWriteAndPagedAttention) {
  const std::vector<AttnCase> cases = {
      {16, 8, 2, 64, {{1, 1}, {17, 1}, {100, 1}, {33, 1}}},       // decode, GQA
      {7, 4, 4, 32, {{5, 5}, {40, 9}, {23, 3}, {1, 1}}},          // prefill chunks and verification
      {1, 6, 1, 80, {{9, 4}, {3, 1}}},                            // MQA, block size 1, odd head_dim
      {16, 4, 2, 128, {{300, 37}, {64, 1}, {129, 5}}},            // long prefill chunk
      // Few (token, head) pairs: the context is split (uneven last share; shares past the end).
      {16, 32, 8, 64, {{1000, 1}}},                               // llama-3.2-1b heads, batch 1
      {16, 2, 1, 64, {{37, 1}}},                                  // more shares than positions
      {8, 8, 2, 64, {{513, 2}, {9, 1}}},                          // verification of a long sequence
  };
  for (const AttnCase& c : cases) {
    int32_t blocks = 3, max_blocks = 0, all = 0, fresh_all = 0;
    for (auto [ctx, fresh] : c.seqs) {
      const int32_t nb = (ctx + c.block_size - 1) / c.block_size;
      blocks += nb;
      max_blocks = std::max(max_blocks, nb);
      all += ctx;
      fresh_all += fresh;
    }
    std::vector<int32_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(++seed_));
    const int32_t S = static_cast<int32_t>(c.seqs.size());
    std::vector<int32_t> tables(S * max_blocks, -1), qs_all{0}, pos_all, slots_all, qs_new{0}, pos_new, slots_new;
    int32_t next = 0;
    for (int32_t s = 0; s < S; ++s) {
      auto [ctx, fresh] = c.seqs[s];
      for (int32_t b = 0; b < (ctx + c.block_size - 1) / c.block_size; ++b) tables[s * max_blocks + b] = order[next++];
      for (int32_t p = 0; p < ctx; ++p) {
        const int32_t slot = tables[s * max_blocks + p / c.block_size] * c.block_size + p % c.block_size;
        pos_all.push_back(p);
        slots_all.push_back(slot);
        if (p >= ctx - fresh) {
          pos_new.push_back(p);
          slots_new.push_back(slot);
        }
      }
      qs_all.push_back(qs_all.back() + ctx);
      qs_new.push_back(qs_new.back() + fresh);
    }
    const int32_t kvd = c.kv_heads * c.head_dim, qd = c.heads * c.head_dim;
    const auto k = In(int64_t{all} * kvd), v = In(int64_t{all} * kvd), q = In(int64_t{fresh_all} * qd);
    const int64_t pool = int64_t{blocks} * c.block_size * kvd;
    auto run = [&](Backend& be) {
      auto kd = ToBackend(be, k), vd = ToBackend(be, v), qdv = ToBackend(be, q);
      testing::DevTensor kp(be, pool, DTypeBytes(be.dtype())), vp(be, pool, DTypeBytes(be.dtype()));
      testing::DevTensor out(be, int64_t{fresh_all} * qd, DTypeBytes(be.dtype()));
      auto tb = RawToBackend(be, tables), qa = RawToBackend(be, qs_all), pa = RawToBackend(be, pos_all),
           sa = RawToBackend(be, slots_all), qn = RawToBackend(be, qs_new), pn = RawToBackend(be, pos_new),
           sn = RawToBackend(be, slots_new);
      const PagedKvLayer layer{kp.get(), vp.get(), blocks, c.block_size, c.kv_heads, c.head_dim};
      be.KvWrite(layer, kd->get(), vd->get(),
                 {S, all, qa->as<int32_t>(), pa->as<int32_t>(), sa->as<int32_t>(), tb->as<int32_t>(), max_blocks});
      be.PagedAttention(qdv->get(), layer,
                        {S, fresh_all, qn->as<int32_t>(), pn->as<int32_t>(), sn->as<int32_t>(), tb->as<int32_t>(), max_blocks},
                        c.heads, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), out.get());
      auto result = FromBackend(be, out.get(), int64_t{fresh_all} * qd);
      // The written slots of the pool (the rest stays poisoned on both sides).
      const auto kh = FromBackend(be, kp.get(), pool), vh = FromBackend(be, vp.get(), pool);
      // Each head's row in the backend's order within a block (PagedKvLayer): the CPU's is
      // [kv_heads, block_size, head_dim], CUDA's [block_size, kv_heads, head_dim].
      const bool head_major = &be == cpu_.get();
      auto at = [&](int32_t slot, int32_t h) {
        const int64_t b = slot / c.block_size, s = slot % c.block_size;
        return (head_major ? (b * c.kv_heads + h) * c.block_size + s : int64_t{slot} * c.kv_heads + h) * c.head_dim;
      };
      for (int32_t slot : slots_all) {
        for (const auto* pool_h : {&kh, &vh}) {
          for (int32_t h = 0; h < c.kv_heads; ++h) {
            result.insert(result.end(), pool_h->begin() + at(slot, h), pool_h->begin() + at(slot, h) + c.head_dim);
          }
        }
      }
      return result;
    };
    ExpectClose(run(*cpu_), run(*gpu_), Tolerance(dt()),
                absl::StrCat("PagedAttention bs=", c.block_size, " heads=", c.heads, "/", c.kv_heads, " hd=", c.head_dim));
  }
}

// Graph padding rows: slot -1 writes nothing, an empty block table gives a zero output.
TEST_P(CudaOpsTest, PaddingTokensWriteNothing) {
  const int32_t bs = 4, kvh = 2, hd = 32, heads = 4;
  Backend& be = *gpu_;
  testing::DevTensor kp(be, 2 * bs * kvh * hd, DTypeBytes(dt())), vp(be, 2 * bs * kvh * hd, DTypeBytes(dt()));
  auto k = ToBackend(be, In(kvh * hd)), v = ToBackend(be, In(kvh * hd)), q = ToBackend(be, In(heads * hd));
  auto qs = RawToBackend(be, std::vector<int32_t>{0, 1}), pos = RawToBackend(be, std::vector<int32_t>{0}),
       slots = RawToBackend(be, std::vector<int32_t>{-1}), table = RawToBackend(be, std::vector<int32_t>{-1, -1});
  const PagedKvLayer layer{kp.get(), vp.get(), 2, bs, kvh, hd};
  const AttentionMetadata meta{1, 1, qs->as<int32_t>(), pos->as<int32_t>(), slots->as<int32_t>(), table->as<int32_t>(), 2};
  testing::DevTensor out(be, heads * hd, DTypeBytes(dt()));
  be.KvWrite(layer, k->get(), v->get(), meta);
  be.PagedAttention(q->get(), layer, meta, heads, 0.1f, out.get());
  for (float x : FromBackend(be, out.get(), heads * hd)) EXPECT_EQ(x, 0.0f);
  for (float x : FromBackend(be, kp.get(), 2 * bs * kvh * hd)) EXPECT_TRUE(std::isnan(x)) << "padding wrote the pool";
}

TEST_P(CudaOpsTest, CopyKvBlocks) {
  const int32_t blocks = 9, bs = 5, kvh = 3, hd = 16;
  const int64_t pool = int64_t{blocks} * bs * kvh * hd;
  const auto k = In(pool), v = In(pool);
  const std::vector<int32_t> src = {0, 4, 8}, dst = {3, 1, 7};
  auto run = [&](Backend& be) {
    auto kd = ToBackend(be, k), vd = ToBackend(be, v);
    auto sd = RawToBackend(be, src), dd = RawToBackend(be, dst);
    be.CopyKvBlocks({kd->get(), vd->get(), blocks, bs, kvh, hd}, sd->as<int32_t>(), dd->as<int32_t>(), 3);
    auto a = FromBackend(be, kd->get(), pool), b = FromBackend(be, vd->get(), pool);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  ExpectClose(run(*cpu_), run(*gpu_), 0.0, "CopyKvBlocks");
}

// True when `token` is where u falls in the CDF of `p`, up to float summation order.
bool ConsistentDraw(const float* p, int32_t vocab, double u, int32_t token) {
  double total = 0, before = 0;
  for (int32_t i = 0; i < vocab; ++i) total += p[i];
  for (int32_t i = 0; i < token; ++i) before += p[i];
  const double target = u * total;
  return p[token] > 0 && target >= before - 1e-5 && target < before + p[token] + 1e-5;
}

// Sampling settings cover greedy, temperature, top-k, top-p and both together.
struct SampleRow {
  float temperature;
  int32_t top_k;
  float top_p;
};
const SampleRow kRows[] = {{0, 0, 1}, {1, 0, 1}, {0.7f, 5, 1}, {1, 0, 0.9f}, {1.3f, 50, 0.8f}, {1, 1, 1}, {0.5f, 0, 0.5f}, {2, 3, 0.95f}};

// Sampling and verification run on float32 logits and probabilities whatever the model dtype:
// one backend suffices.
class CudaSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SPECULA_REQUIRE_GPU();
    cpu_ = MakeCpuBackend();
    auto gpu = MakeBackend({"cuda", "f32"});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(gpu).value();
  }

  std::unique_ptr<Backend> cpu_, gpu_;
  uint64_t seed_ = 2000;
};

TEST_F(CudaSamplingTest, SampleMatchesTheHostSampler) {
  for (int32_t vocab : {97, 1000, 32000}) {
    const int32_t m = 64;
    const auto logits = RandomVec(int64_t{m} * vocab, ++seed_, 6.0f);
    std::vector<float> temp(m), top_p(m), uniform(m);
    std::vector<int32_t> top_k(m);
    std::mt19937_64 rng(++seed_);
    for (int32_t r = 0; r < m; ++r) {
      const SampleRow& row = kRows[r % std::size(kRows)];
      temp[r] = row.temperature;
      top_k[r] = row.top_k;
      top_p[r] = row.top_p;
      uniform[r] = std::uniform_real_distribution<float>(0, 1)(rng);
    }
    Backend& be = *gpu_;
    auto ld = RawToBackend(be, logits), td = RawToBackend(be, temp), kd = RawToBackend(be, top_k),
         pd = RawToBackend(be, top_p), ud = RawToBackend(be, uniform);
    testing::DevTensor probs(be, int64_t{m} * vocab, sizeof(float)), tokens(be, m, sizeof(int32_t));
    be.Sample(ld->as<float>(), m, vocab, {td->as<float>(), kd->as<int32_t>(), pd->as<float>(), ud->as<float>()},
              probs.as<float>(), tokens.as<int32_t>());
    const auto got_p = FromBackend(be, probs.get(), int64_t{m} * vocab, true);
    const auto got_t = RawFromBackend<int32_t>(be, tokens.get(), m);
    std::vector<float> want;
    for (int32_t r = 0; r < m; ++r) {
      SamplingParams sp;
      sp.temperature = temp[r];
      sp.top_k = top_k[r];
      sp.top_p = top_p[r];
      SamplingProbabilities(sp, absl::MakeConstSpan(logits.data() + int64_t{r} * vocab, vocab), {}, &want);
      const std::vector<float> row(got_p.begin() + int64_t{r} * vocab, got_p.begin() + int64_t{r + 1} * vocab);
      ExpectClose(want, row, 1e-5, absl::StrCat("Sample probs vocab=", vocab, " row=", r));
      EXPECT_TRUE(ConsistentDraw(want.data(), vocab, uniform[r], got_t[r]))
          << "vocab=" << vocab << " row " << r << " drew " << got_t[r] << " at u=" << uniform[r];
    }
  }
}

// A random verification batch: target and draft distributions, drafts drawn from q.
struct VerifyBatch {
  int32_t S = 24, k = 4, vocab = 50;
  std::vector<int32_t> num_drafts, draft;
  std::vector<float> p, q, ua, uf;

  explicit VerifyBatch(uint64_t seed, bool greedy) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(0, 1);
    auto dist = [&](float* row, bool one_hot) {
      double sum = 0;
      for (int32_t v = 0; v < vocab; ++v) sum += row[v] = std::exp(4 * u(rng));
      for (int32_t v = 0; v < vocab; ++v) row[v] = static_cast<float>(row[v] / sum);
      if (one_hot) {
        const int32_t a = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
        for (int32_t v = 0; v < vocab; ++v) row[v] = v == a ? 1.0f : 0.0f;
      }
    };
    p.resize(int64_t{S} * (k + 1) * vocab);
    q.resize(int64_t{S} * k * vocab);
    for (int64_t r = 0; r < int64_t{S} * (k + 1); ++r) dist(p.data() + r * vocab, greedy);
    for (int64_t r = 0; r < int64_t{S} * k; ++r) dist(q.data() + r * vocab, false);
    for (int32_t s = 0; s < S; ++s) {
      num_drafts.push_back(s % (k + 1));
      for (int32_t i = 0; i < k; ++i) {
        const float* qr = q.data() + (int64_t{s} * k + i) * vocab;
        // Half the drafts follow the target's argmax so that acceptance runs happen.
        const float* pr = p.data() + (int64_t{s} * (k + 1) + i) * vocab;
        draft.push_back(i % 2 == 0 ? static_cast<int32_t>(std::max_element(pr, pr + vocab) - pr)
                                   : SampleCategorical(absl::MakeConstSpan(qr, vocab), u(rng)));
        ua.push_back(u(rng));
      }
      uf.push_back(u(rng));
    }
  }

  std::pair<std::vector<int32_t>, std::vector<int32_t>> Run(Backend& be, bool one_hot_drafts) const {
    auto nd = RawToBackend(be, num_drafts), dr = RawToBackend(be, draft), pd = RawToBackend(be, p),
         qd = RawToBackend(be, q), uad = RawToBackend(be, ua), ufd = RawToBackend(be, uf);
    testing::DevTensor acc(be, S, 4), tok(be, int64_t{S} * (k + 1), 4);
    VerifyArgs a{S, k, vocab, nd->as<int32_t>(), dr->as<int32_t>(), pd->as<float>(),
                 one_hot_drafts ? nullptr : qd->as<float>(), uad->as<float>(), ufd->as<float>(),
                 acc.as<int32_t>(), tok.as<int32_t>()};
    be.VerifyDrafts(a);
    auto accepted = RawFromBackend<int32_t>(be, acc.get(), S);
    auto tokens = RawFromBackend<int32_t>(be, tok.get(), int64_t{S} * (k + 1));
    // Only the first num_accepted + 1 tokens of a row are defined.
    for (int32_t s = 0; s < S; ++s) {
      for (int32_t i = accepted[s] + 1; i <= k; ++i) tokens[s * (k + 1) + i] = -1;
    }
    return {accepted, tokens};
  }
};

TEST_F(CudaSamplingTest, VerifyDraftsMatchesTheReference) {
  for (bool greedy : {false, true}) {
    for (bool one_hot : {false, true}) {
      const VerifyBatch b(++seed_, greedy);
      const auto want = b.Run(*cpu_, one_hot), got = b.Run(*gpu_, one_hot);
      EXPECT_EQ(want.first, got.first) << "accepted counts, greedy=" << greedy << " one_hot=" << one_hot;
      EXPECT_EQ(want.second, got.second) << "tokens, greedy=" << greedy << " one_hot=" << one_hot;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaOpsTest, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Runs everywhere: without a GPU the CUDA backend is refused with a clear error, not a crash.
TEST(CudaBackendTest, RefusedCleanlyWithoutADevice) {
  auto be = MakeBackend({"cuda", "bf16"});
  if (CudaDevices() > 0) {
    ASSERT_TRUE(be.ok()) << be.status();
    EXPECT_STREQ((*be)->name(), "cuda");
  } else {
    ASSERT_FALSE(be.ok());
    EXPECT_EQ(be.status().code(), absl::StatusCode::kFailedPrecondition) << be.status();
    EXPECT_NE(be.status().message().find("no CUDA device"), std::string::npos) << be.status();
  }
}

}  // namespace
}  // namespace specula
