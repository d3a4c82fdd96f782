// The CPU backend's KV storage and paged attention, for float32 and bf16 pools, against
// softmax(q k^T * scale) v in double over the values the pool holds. Also built against the AVX2
// variant of the backend (kernel_tests_avx2), so that both SIMD paths are checked on every machine.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/simd.h"

namespace specula {
namespace {

using cpu::Bf16;
using cpu::ToBf16;
using cpu::ToF32;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

TEST(Bf16Test, RoundsToNearestEvenLikeTheCoreConversion) {
  EXPECT_EQ(ToBf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(ToBf16(1.00390625f).bits, 0x3F80);  // halfway: to the even 1.0
  EXPECT_EQ(ToBf16(1.01171875f).bits, 0x3F82);  // halfway: to the even 1.015625
  EXPECT_EQ(ToBf16(FromBits(0x3F808001)).bits, 0x3F81);  // just past halfway
  EXPECT_EQ(ToBf16(-2.0f).bits, 0xC000);
  EXPECT_EQ(ToBf16(INFINITY).bits, 0x7F80);
  EXPECT_EQ(ToBf16(FromBits(0x7F7FFFFF)).bits, 0x7F80);  // the largest float rounds to infinity
  EXPECT_TRUE(std::isnan(ToF32(ToBf16(NAN))));
  EXPECT_TRUE(std::isnan(ToF32(ToBf16(FromBits(0x7F800001)))));  // a NaN whose payload is in the low bits
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(ToBf16(f).bits, F32ToBf16(f)) << std::hex << Bits(f);
    ASSERT_EQ(Bits(ToF32(ToBf16(f))), static_cast<uint32_t>(F32ToBf16(f)) << 16);
  }
}

#ifdef SPECULA_SIMD
// The vector layer's Exp (softmax, SiluMul) against std::exp over ExpApprox's range, and at the
// edges: NaN and +inf give exp(88) as ExpApprox does, -inf exp(-87).
template <typename S>
void CheckVectorExp() {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-87.0f, 88.0f);
  std::vector<float> x(4096);
  for (float& v : x) v = u(rng);
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -87.0f, 100.0f, -100.0f, INFINITY, -INFINITY, NAN, 0.5f};
  std::copy(std::begin(edges), std::end(edges), x.begin());
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += S::kLanes) S::Store(y.data() + i, cpu::ExpLanes<S>(S::Load(x.data() + i)));
  for (size_t i = 0; i < x.size(); ++i) {
    const double c = std::isnan(x[i]) ? 88.0 : std::clamp(static_cast<double>(x[i]), -87.0, 88.0);
    // 4e-7 near 0; x * log2(e) is rounded to float first: about |x| * 7e-8 more (6e-6 at |x| = 88).
    ASSERT_NEAR(y[i], std::exp(c), (4e-7 + 8e-8 * std::abs(c)) * std::exp(c)) << "lanes " << S::kLanes << " x " << x[i];
  }
}

TEST(SimdTest, VectorExpMatchesExp) {
#ifdef SPECULA_AVX2
  CheckVectorExp<cpu::Simd8>();
#endif
#ifdef __AVX512F__
  CheckVectorExp<cpu::Simd16>();
#endif
}
#endif

// A pool of `dtype` elements for one layer, filled with random values; at() reads what it holds.
struct Pool {
  DType dtype;
  int32_t blocks, bs, kv_heads, hd;
  std::vector<float> kf, vf;      // f32 storage
  std::vector<Bf16> kb, vb;       // bf16 storage

  Pool(DType d, int32_t blocks_, int32_t bs_, int32_t kv_heads_, int32_t hd_, std::mt19937* rng)
      : dtype(d), blocks(blocks_), bs(bs_), kv_heads(kv_heads_), hd(hd_) {
    const size_t n = static_cast<size_t>(blocks) * bs * kv_heads * hd;
    std::normal_distribution<float> normal(0, 1);
    for (auto* f : {&kf, &vf}) {
      f->resize(n);
      for (float& x : *f) x = normal(*rng);
    }
    if (d == DType::kBF16) {
      for (auto [f, b] : {std::pair{&kf, &kb}, std::pair{&vf, &vb}}) {
        b->resize(n);
        for (size_t i = 0; i < n; ++i) (*b)[i] = ToBf16((*f)[i]);
      }
    }
  }
  PagedKvLayer Layer() {
    if (dtype == DType::kBF16) return {kb.data(), vb.data(), blocks, bs, kv_heads, hd, dtype};
    return {kf.data(), vf.data(), blocks, bs, kv_heads, hd, dtype};
  }
  // The CPU pool's order: [blocks, kv_heads, bs, hd].
  double at(bool key, int64_t slot, int32_t kvh, int32_t d) const {
    const size_t i = ((static_cast<size_t>(slot / bs) * kv_heads + kvh) * bs + slot % bs) * hd + d;
    if (dtype == DType::kBF16) return ToF32((key ? kb : vb)[i]);
    return (key ? kf : vf)[i];
  }
};

// Per sequence: its new tokens and its context length (the last new token's position + 1).
struct SeqShape {
  int32_t new_tokens, ctx;
};

void CheckAttention(DType dtype, const std::vector<SeqShape>& shape, int32_t hd, int32_t bs, std::mt19937* rng) {
  auto be = MakeCpuBackend();
  const int32_t kv_heads = 2, heads = 6, blocks = 200;
  const int32_t seqs = static_cast<int32_t>(shape.size());
  int32_t max_ctx = 0, tokens = 0;
  for (const SeqShape& s : shape) max_ctx = std::max(max_ctx, s.ctx), tokens += s.new_tokens;
  const int32_t max_blocks = (max_ctx + bs - 1) / bs;
  Pool pool(dtype, blocks, bs, kv_heads, hd, rng);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> q(static_cast<size_t>(tokens) * heads * hd);
  for (float& x : q) x = normal(*rng);
  std::vector<int32_t> tables(static_cast<size_t>(seqs) * max_blocks), positions, query_start, slots(tokens, -1);
  std::vector<int32_t> perm(blocks);
  for (int32_t i = 0; i < blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), *rng);
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = perm[(s * max_blocks + b) % blocks];
    query_start.push_back(static_cast<int32_t>(positions.size()));
    for (int32_t i = 0; i < shape[s].new_tokens; ++i) positions.push_back(shape[s].ctx - shape[s].new_tokens + i);
  }
  query_start.push_back(tokens);
  AttentionMetadata meta;
  meta.num_tokens = tokens;
  meta.num_seqs = seqs;
  meta.positions = positions.data();
  meta.query_start = query_start.data();
  meta.block_tables = tables.data();
  meta.max_blocks_per_seq = max_blocks;
  meta.slot_mapping = slots.data();
  std::vector<float> out(q.size(), NAN);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  be->PagedAttention(q.data(), pool.Layer(), meta, heads, scale, out.data());
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t t = query_start[s]; t < query_start[s + 1]; ++t) {
      const int32_t ctx = positions[t] + 1;
      for (int32_t h = 0; h < heads; ++h) {
        const int32_t kvh = h / (heads / kv_heads);
        auto slot = [&](int32_t pos) { return static_cast<int64_t>(tables[s * max_blocks + pos / bs]) * bs + pos % bs; };
        std::vector<double> p(ctx);
        double mx = -1e300, sum = 0;
        for (int32_t c = 0; c < ctx; ++c) {
          double dot = 0;
          for (int32_t d = 0; d < hd; ++d) dot += q[(static_cast<size_t>(t) * heads + h) * hd + d] * pool.at(true, slot(c), kvh, d);
          p[c] = dot * scale;
          mx = std::max(mx, p[c]);
        }
        for (double& v : p) sum += (v = std::exp(v - mx));
        for (int32_t d = 0; d < hd; ++d) {
          double o = 0;
          for (int32_t c = 0; c < ctx; ++c) o += p[c] / sum * pool.at(false, slot(c), kvh, d);
          ASSERT_NEAR(out[(static_cast<size_t>(t) * heads + h) * hd + d], o, 2e-5)
              << DTypeName(dtype) << " hd " << hd << " bs " << bs << " seq " << s << " token " << t << " head " << h
              << " dim " << d;
        }
      }
    }
  }
}

// Every head size the SIMD kernel specializes at 16 or 8 lanes (and 12, which takes the portable loop), block sizes
// 1, 5 and 16, GQA, both pool types, and each path: a few decode tokens or short causal runs
// (verification) head by head, many decode tokens (all heads of a token together), longer causal
// runs and prefill chunks.
TEST(CpuAttentionTest, EveryPathMatchesReference) {
  std::mt19937 rng(5);
  const std::vector<std::vector<SeqShape>> cases = {
      {{1, 1}, {1, 17}, {1, 40}, {1, 100}},
      {{1, 1}, {1, 17}, {1, 40}, {1, 100}, {1, 3}, {1, 64}, {1, 65}, {1, 16}, {1, 2}, {1, 33}},
      {{5, 5}, {3, 50}, {2, 97}},
      {{3, 40}, {2, 17}},
      {{9, 9}, {1, 30}, {40, 100}}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const auto& c : cases) {
      for (int32_t hd : {8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128}) {
        for (int32_t bs : {1, 5, 16}) {
          CheckAttention(dtype, c, hd, bs, &rng);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// A token's output is the same bits whether it runs alone (head by head), with one token of each of
// many sequences, or in a group of up to 8 tokens of its sequence that share each block (a prefill
// chunk's, a verification's): batched and speculative decoding rely on it. Two runs of the few-token
// path are checked too: a verification's 5 tokens alone, and 2 + 1 tokens of two sequences.
TEST(CpuAttentionTest, ATokenGetsTheSameBitsInEveryGrouping) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int32_t hd : {8, 12, 48, 64}) {
      auto be = MakeCpuBackend();
      const int32_t kv_heads = 2, heads = 6, bs = 16, blocks = 64, max_blocks = 8;
      Pool pool(dtype, blocks, bs, kv_heads, hd, &rng);
      // Sequence 0: 37 new tokens ending at position 99; sequences 1-9: one token each.
      const int32_t seqs = 10, chunk = 37;
      std::vector<int32_t> tables(seqs * max_blocks), positions, query_start, perm(blocks);
      for (int32_t i = 0; i < blocks; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int32_t i = 0; i < seqs * max_blocks; ++i) tables[i] = perm[i % blocks];
      for (int32_t s = 0; s < seqs; ++s) {
        query_start.push_back(static_cast<int32_t>(positions.size()));
        for (int32_t i = 0; i < (s == 0 ? chunk : 1); ++i) positions.push_back(s == 0 ? 100 - chunk + i : 20 + 9 * s);
      }
      const int32_t tokens = static_cast<int32_t>(positions.size());
      query_start.push_back(tokens);
      std::vector<int32_t> slots(tokens, -1);
      std::normal_distribution<float> normal(0, 1);
      std::vector<float> q(static_cast<size_t>(tokens) * heads * hd), all(q.size()), alone(heads * hd);
      for (float& x : q) x = normal(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      AttentionMetadata meta{seqs, tokens, query_start.data(), positions.data(),
                             slots.data(), tables.data(), max_blocks};
      be->PagedAttention(q.data(), pool.Layer(), meta, heads, scale, all.data());
      // The few-token path: sequence 0's last 5 tokens alone; its last 2 with sequence 1's token.
      for (const std::vector<int32_t>& run : {std::vector<int32_t>{5}, std::vector<int32_t>{2, 1}}) {
        std::vector<int32_t> starts = {0}, pos, tabs, from;  // from: each token's index in the full run
        for (size_t r = 0; r < run.size(); ++r) {
          const int32_t s = static_cast<int32_t>(r), last = query_start[s + 1] - 1;
          for (int32_t i = run[r] - 1; i >= 0; --i) from.push_back(last - i), pos.push_back(positions[last - i]);
          starts.push_back(static_cast<int32_t>(pos.size()));
          tabs.insert(tabs.end(), &tables[s * max_blocks], &tables[(s + 1) * max_blocks]);
        }
        const int32_t n = static_cast<int32_t>(pos.size());
        std::vector<float> qs, got(static_cast<size_t>(n) * heads * hd);
        for (int32_t t : from) qs.insert(qs.end(), &q[static_cast<size_t>(t) * heads * hd], &q[static_cast<size_t>(t + 1) * heads * hd]);
        AttentionMetadata few{static_cast<int32_t>(run.size()), n, starts.data(), pos.data(), slots.data(), tabs.data(), max_blocks};
        be->PagedAttention(qs.data(), pool.Layer(), few, heads, scale, got.data());
        for (int32_t i = 0; i < n; ++i) {
          ASSERT_EQ(0, std::memcmp(got.data() + static_cast<size_t>(i) * heads * hd,
                                   all.data() + static_cast<size_t>(from[i]) * heads * hd, sizeof(float) * heads * hd))
              << DTypeName(dtype) << " hd " << hd << " few-token run of " << run.size() << " sequences, token " << i;
        }
      }
      for (int32_t s = 0; s < seqs; ++s) {
        for (int32_t t = query_start[s]; t < query_start[s + 1]; ++t) {
          const int32_t start[2] = {0, 1};
          AttentionMetadata one{1, 1, start, &positions[t], slots.data(), &tables[s * max_blocks], max_blocks};
          const float* qt = q.data() + static_cast<size_t>(t) * heads * hd;
          be->PagedAttention(qt, pool.Layer(), one, heads, scale, alone.data());
          ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + static_cast<size_t>(t) * heads * hd, alone.size() * 4))
              << DTypeName(dtype) << " hd " << hd << " sequence " << s << " token " << t;
        }
      }
    }
  }
}

// The KV pool's memory (AllocScattered) starts on a 2 MB boundary, so that transparent huge pages
// can back all of it, and every byte of what was asked for is usable (ASan checks the bounds).
TEST(CpuAttentionTest, KvPoolMemoryIsHugePageAligned) {
  auto be = MakeCpuBackend();
  for (size_t bytes : {size_t{1}, size_t{3} << 20, (size_t{4} << 20) + 5}) {
    auto p = be->AllocScattered(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(*p) % (size_t{2} << 20)) << bytes << " bytes";
    std::memset(*p, 0x5a, bytes);
    EXPECT_EQ(0x5a, static_cast<unsigned char*>(*p)[bytes - 1]);
    be->Free(*p);
  }
}

TEST(CpuAttentionTest, KvWriteConvertsAndCopyMovesWholeBlocks) {
  auto be = MakeCpuBackend();
  ASSERT_TRUE(be->SupportsKvDtype(DType::kF32));
  ASSERT_TRUE(be->SupportsKvDtype(DType::kBF16));
  EXPECT_FALSE(be->SupportsKvDtype(DType::kF16));
  std::mt19937 rng(9);
  // A few tokens, and a prefill chunk of 500 (at the stories15m shape), whose rows the write splits
  // over both cores (these runs have 2 OpenMP threads).
  struct Case {
    int32_t blocks, bs, kv_heads, hd;
    std::vector<int32_t> slots;  // -1: padding, nothing written
  };
  std::vector<int32_t> chunk(500);
  for (int32_t i = 0; i < 500; ++i) chunk[i] = i % 50 == 7 ? -1 : (i * 7) % 640;  // 7 is prime to 640
  for (const Case& c : {Case{6, 4, 3, 8, {5, -1, 0, 23}}, Case{40, 16, 6, 48, chunk}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int32_t blocks = c.blocks, bs = c.bs, kv_heads = c.kv_heads, hd = c.hd, row = kv_heads * hd;
      Pool pool(dtype, blocks, bs, kv_heads, hd, &rng);
      const std::vector<int32_t>& slots = c.slots;
      std::normal_distribution<float> normal(0, 1);
      std::vector<float> k(slots.size() * row), v(k.size());
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      Pool before = pool;
      AttentionMetadata meta;
      meta.num_tokens = static_cast<int32_t>(slots.size());
      meta.slot_mapping = slots.data();
      be->KvWrite(pool.Layer(), k.data(), v.data(), meta);
      for (int64_t slot = 0; slot < blocks * bs; ++slot) {
        const auto it = std::find(slots.begin(), slots.end(), slot);
        for (int32_t i = 0; i < row; ++i) {
          double want_k = before.at(true, slot, i / hd, i % hd), want_v = before.at(false, slot, i / hd, i % hd);
          if (it != slots.end()) {
            const size_t t = it - slots.begin();
            want_k = dtype == DType::kBF16 ? ToF32(ToBf16(k[t * row + i])) : k[t * row + i];
            want_v = dtype == DType::kBF16 ? ToF32(ToBf16(v[t * row + i])) : v[t * row + i];
          }
          ASSERT_EQ(pool.at(true, slot, i / hd, i % hd), want_k) << DTypeName(dtype) << " slot " << slot;
          ASSERT_EQ(pool.at(false, slot, i / hd, i % hd), want_v) << DTypeName(dtype) << " slot " << slot;
        }
      }
      const std::vector<int32_t> src = {0, 5}, dst = {2, 3};
      before = pool;
      be->CopyKvBlocks(pool.Layer(), src.data(), dst.data(), 2);
      for (int32_t b = 0; b < blocks; ++b) {
        const int32_t from = b == 2 ? 0 : b == 3 ? 5 : b;
        for (int32_t j = 0; j < bs * row; ++j) {
          ASSERT_EQ(pool.at(true, b * bs + j / row, j % row / hd, j % hd), before.at(true, from * bs + j / row, j % row / hd, j % hd));
          ASSERT_EQ(pool.at(false, b * bs + j / row, j % row / hd, j % hd), before.at(false, from * bs + j / row, j % row / hd, j % hd));
        }
      }
    }
  }
}

}  // namespace
}  // namespace specula
