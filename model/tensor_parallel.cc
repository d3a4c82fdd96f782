#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "model/weights.h"

namespace specula {
namespace {

// [begin, end) of rank r when n units are split over `size` ranks as evenly as possible.
std::pair<int32_t, int32_t> Split(int64_t n, int32_t size, int32_t r) {
  return {static_cast<int32_t>(n * r / size), static_cast<int32_t>(n * (r + 1) / size)};
}

// Matrix [rows, cols] from row `r0` on: a view.
Matrix RowsFrom(const Matrix& m, int64_t cols, int64_t r0) {
  if (m.data == nullptr) return m;
  return Matrix(static_cast<const uint8_t*>(m.data) + r0 * QuantRowBytes(m.type, cols), m.type);
}
const float* RowsFrom(const float* v, int64_t r0) { return v == nullptr ? nullptr : v + r0; }

// Columns [c0, c1) of every row of m [rows, cols], copied, with the columns outside [keep0, keep1)
// (relative to c0) set to zero. Cuts are on block boundaries (PlanShard checked them).
Matrix Columns(ModelWeights& w, const Matrix& m, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
               int64_t keep0, int64_t keep1) {
  const int64_t blk = QuantBlockSize(m.type), bb = QuantBlockBytes(m.type), row_bytes = QuantRowBytes(m.type, cols);
  const int64_t off = c0 / blk * bb, nb = (c1 - c0) / blk * bb, k0 = keep0 / blk * bb, k1 = keep1 / blk * bb;
  std::vector<uint8_t> out(static_cast<size_t>(rows * nb));  // [rows, c1 - c0] in m.type
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = out.data() + r * nb;
    std::memcpy(dst, static_cast<const uint8_t*>(m.data) + r * row_bytes + off, nb);
    std::memset(dst, 0, k0);  // a zero block dequantizes to zeros, whatever the type
    std::memset(dst + k1, 0, nb - k1);
  }
  w.Release(m.data, static_cast<size_t>(rows * row_bytes));
  if (m.type == QuantType::kF32) {
    std::vector<float> f(out.size() / sizeof(float));
    std::memcpy(f.data(), out.data(), out.size());
    w.owned.push_back(std::move(f));
    return Matrix(w.owned.back().data());
  }
  w.owned_blocks.push_back(std::move(out));
  return Matrix(w.owned_blocks.back().data(), m.type);
}

}  // namespace

absl::StatusOr<TpShard> PlanShard(const ModelConfig& c, int32_t size, int32_t rank, QuantType wo_type,
                                  QuantType down_type) {
  const std::string tp = absl::StrCat("--tensor-parallel-size ", size);
  if (size < 1 || rank < 0 || rank >= size) return absl::InvalidArgumentError(absl::StrCat(tp, ": rank ", rank));
  if (size > c.num_heads) {
    return absl::InvalidArgumentError(absl::StrCat(tp, " exceeds the model's ", c.num_heads,
                                                   " attention heads: every rank needs at least one"));
  }
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(tp, ": ", c.num_heads, " heads over ", c.num_kv_heads, " KV heads"));
  }
  TpShard s;
  s.rank = rank;
  s.size = size;
  const int32_t group = c.num_heads / c.num_kv_heads;
  std::tie(s.own_begin, s.own_end) = Split(c.num_heads, size, rank);
  s.kv_begin = s.own_begin / group;
  s.kv_end = (s.own_end - 1) / group + 1;
  // Compact when every KV head serves as many owned heads as the others; else whole groups.
  bool even = true;
  const int32_t per_kv = std::min(s.own_end, (s.kv_begin + 1) * group) - s.own_begin;
  for (int32_t k = s.kv_begin; k < s.kv_end; ++k) {
    even = even && std::min(s.own_end, (k + 1) * group) - std::max(s.own_begin, k * group) == per_kv;
  }
  s.q_begin = even ? s.own_begin : s.kv_begin * group;
  s.q_end = even ? s.own_end : s.kv_end * group;

  // o_proj's columns are cut at head boundaries (and heads zeroed whole), down's on hidden units.
  const int64_t wo_block = QuantBlockSize(wo_type), down_block = QuantBlockSize(down_type);
  if (c.head_dim % wo_block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(tp, ": o_proj is ", QuantTypeName(wo_type), " (blocks of ", wo_block,
                                                   ") and head_dim ", c.head_dim,
                                                   " does not cut on a block boundary"));
  }
  if (c.hidden_dim % down_block != 0 || c.hidden_dim / down_block < size) {
    return absl::InvalidArgumentError(absl::StrCat(tp, ": the ", c.hidden_dim, " hidden units in blocks of ",
                                                   down_block, " (", QuantTypeName(down_type),
                                                   ") do not give every rank a block"));
  }
  const auto [h0, h1] = Split(c.hidden_dim / down_block, size, rank);
  s.hidden_begin = static_cast<int32_t>(h0 * down_block);
  s.hidden_end = static_cast<int32_t>(h1 * down_block);
  if (c.vocab_size < size) {
    return absl::InvalidArgumentError(absl::StrCat(tp, " exceeds the vocabulary of ", c.vocab_size));
  }
  s.vocab_stride = (c.vocab_size + size - 1) / size;
  s.vocab_begin = std::min(c.vocab_size, rank * s.vocab_stride);
  s.vocab_end = std::min(c.vocab_size, (rank + 1) * s.vocab_stride);
  if (s.vocab_end <= s.vocab_begin) {
    return absl::InvalidArgumentError(absl::StrCat(tp, ": rank ", rank, " gets no rows of the ", c.vocab_size,
                                                   "-token classifier"));
  }
  return s;
}

absl::Status ShardWeights(ModelWeights& w, const TpShard& s) {
  if (!s.active()) return absl::OkStatus();
  ModelConfig& c = w.config;
  const int64_t hd = c.head_dim, dim = c.dim, hid = c.hidden_dim;
  const int64_t q0 = s.q_begin * hd, q1 = s.q_end * hd, k0 = s.kv_begin * hd;
  // o_proj's columns, relative to q0, of the heads this rank adds up (the others become zeros).
  const int64_t keep0 = (s.own_begin - s.q_begin) * hd, keep1 = (s.own_end - s.q_begin) * hd;
  for (LayerWeights& l : w.layers) {
    l.wq = RowsFrom(l.wq, dim, q0);
    l.bq = RowsFrom(l.bq, q0);
    l.wk = RowsFrom(l.wk, dim, k0);
    l.wv = RowsFrom(l.wv, dim, k0);
    l.bk = RowsFrom(l.bk, k0);
    l.bv = RowsFrom(l.bv, k0);
    l.wo = Columns(w, l.wo, dim, c.q_dim(), q0, q1, keep0, keep1);
    l.w_gate = RowsFrom(l.w_gate, dim, s.hidden_begin);
    l.w_up = RowsFrom(l.w_up, dim, s.hidden_begin);
    l.w_down = Columns(w, l.w_down, dim, hid, s.hidden_begin, s.hidden_end, 0, s.hidden_end - s.hidden_begin);
  }
  w.lm_head = RowsFrom(w.lm_head, dim, s.vocab_begin);
  c.num_heads = s.q_end - s.q_begin;
  c.num_kv_heads = s.kv_end - s.kv_begin;
  c.hidden_dim = s.hidden_end - s.hidden_begin;
  w.shard = s;
  return absl::OkStatus();
}

}  // namespace specula

namespace specula {
namespace {

template <typename T>
void Put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
void PutVec(std::string* out, const std::vector<T>& v) {
  Put<uint32_t>(out, static_cast<uint32_t>(v.size()));
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

struct Reader {
  const std::string& s;
  size_t at = 0;
  bool ok = true;
  template <typename T>
  T Get() {
    T v{};
    if (at + sizeof(T) > s.size()) {
      ok = false;
      return v;
    }
    std::memcpy(&v, s.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> GetVec() {
    const uint32_t n = Get<uint32_t>();
    if (!ok || (s.size() - at) / sizeof(T) < n) {
      ok = false;
      return {};
    }
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), s.data() + at, n * sizeof(T));
    at += n * sizeof(T);
    return v;
  }
};

}  // namespace

ForwardBatch StepMessage::Batch() const {
  ForwardBatch b;
  for (size_t i = 0; i < start_pos.size(); ++i) {
    b.seqs.push_back({absl::MakeConstSpan(tokens[i]), start_pos[i], absl::MakeConstSpan(tables[i]), all_logits[i] != 0});
  }
  return b;
}

StepMessage ForwardMessage(const ForwardBatch& batch) {
  StepMessage m;
  m.op = StepMessage::kForward;
  for (const SequenceInput& in : batch.seqs) {
    m.start_pos.push_back(in.start_pos);
    m.all_logits.push_back(in.all_logits ? 1 : 0);
    m.tokens.emplace_back(in.tokens.begin(), in.tokens.end());
    m.tables.emplace_back(in.block_table.begin(), in.block_table.end());
  }
  return m;
}

std::string EncodeStepMessage(const StepMessage& m) {
  std::string out;
  Put<uint8_t>(&out, m.op);
  PutVec(&out, m.released_pools);
  if (m.op != StepMessage::kForward) return out;
  Put(&out, m.pool_id);
  Put(&out, m.block_size);
  Put(&out, m.num_blocks);
  Put<uint8_t>(&out, static_cast<uint8_t>(m.kv_dtype));
  Put(&out, m.logits_mode);
  PutVec(&out, m.start_pos);
  PutVec(&out, m.all_logits);
  for (size_t i = 0; i < m.start_pos.size(); ++i) {
    PutVec(&out, m.tokens[i]);
    PutVec(&out, m.tables[i]);
  }
  return out;
}

absl::Status DecodeStepMessage(const std::string& bytes, StepMessage* m) {
  Reader r{bytes};
  *m = StepMessage();
  const uint8_t op = r.Get<uint8_t>();
  m->released_pools = r.GetVec<uint64_t>();
  if (r.ok && op == StepMessage::kStop) {
    m->op = StepMessage::kStop;
  } else if (r.ok && op == StepMessage::kForward) {
    m->op = StepMessage::kForward;
    m->pool_id = r.Get<uint64_t>();
    m->block_size = r.Get<int32_t>();
    m->num_blocks = r.Get<int32_t>();
    const uint8_t dt = r.Get<uint8_t>();
    m->kv_dtype = static_cast<DType>(dt);
    m->logits_mode = r.Get<uint8_t>();
    m->start_pos = r.GetVec<int32_t>();
    m->all_logits = r.GetVec<uint8_t>();
    r.ok = r.ok && dt <= static_cast<uint8_t>(DType::kBF16) && m->all_logits.size() == m->start_pos.size();
    for (size_t i = 0; r.ok && i < m->start_pos.size(); ++i) {
      m->tokens.push_back(r.GetVec<TokenId>());
      m->tables.push_back(r.GetVec<BlockId>());
    }
  } else {
    r.ok = false;
  }
  if (!r.ok || r.at != bytes.size()) {
    return absl::DataLossError(absl::StrCat("malformed step message from rank 0 (", bytes.size(), " bytes, op ",
                                            static_cast<int>(op), ")"));
  }
  return absl::OkStatus();
}

}  // namespace specula
