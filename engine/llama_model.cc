#include "engine/llama_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace specula {

LlamaModel::LlamaModel(std::unique_ptr<ModelWeights> weights, std::unique_ptr<Backend> backend)
    : weights_(std::move(weights)), backend_(std::move(backend)) {
  const ModelConfig& c = weights_->config;
  const std::vector<float> inv_freq = RopeInvFreq(c);  // [head_dim / 2]
  const int32_t half = c.head_dim / 2;
  cos_sin_.resize(static_cast<size_t>(c.max_seq_len) * c.head_dim);
  for (int32_t pos = 0; pos < c.max_seq_len; ++pos) {
    float* row = cos_sin_.data() + static_cast<size_t>(pos) * c.head_dim;
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[i];
      row[i] = static_cast<float>(std::cos(angle));
      row[half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

absl::Status LlamaModel::Validate(const ForwardBatch& batch, const KvCache& kv) const {
  const ModelConfig& c = config();
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceInput& in = batch.seqs[s];
    if (in.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " brings no tokens"));
    }
    if (in.start_pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": negative start_pos"));
    }
    const int64_t end = static_cast<int64_t>(in.start_pos) + in.tokens.size();
    if (end > c.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": ", end, " tokens exceed the model context of ", c.max_seq_len));
    }
    const int64_t blocks = (end + kv.block_size() - 1) / kv.block_size();
    if (static_cast<int64_t>(in.block_table.size()) < blocks) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table has ",
                                                     in.block_table.size(), " blocks, ", end,
                                                     " tokens need ", blocks));
    }
    for (BlockId b : in.block_table) {
      if (b < 0 || b >= kv.num_blocks()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block id ", b, " outside the pool of ", kv.num_blocks()));
      }
    }
    for (TokenId t : in.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": token id ", t,
                                                       " outside the vocabulary of ", c.vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, KvCache& kv, LogitsMode mode,
                                 std::vector<float>* logits) {
  if (auto st = Validate(batch, kv); !st.ok()) return st;
  const ModelConfig& c = config();
  const int32_t T = batch.NumTokens();
  const int32_t S = static_cast<int32_t>(batch.seqs.size());
  const int32_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;

  // Flatten the batch: token ids, positions, KV slots and padded block tables.
  int32_t max_blocks = 0;
  for (const auto& s : batch.seqs) max_blocks = std::max<int32_t>(max_blocks, s.block_table.size());
  token_ids_.resize(T);
  positions_.resize(T);
  slots_.resize(T);
  query_start_.resize(S + 1);
  tables_.assign(static_cast<size_t>(S) * max_blocks, -1);
  out_rows_.clear();
  int32_t t = 0;
  for (int32_t s = 0; s < S; ++s) {
    const SequenceInput& in = batch.seqs[s];
    query_start_[s] = t;
    std::copy(in.block_table.begin(), in.block_table.end(), tables_.begin() + s * max_blocks);
    for (size_t i = 0; i < in.tokens.size(); ++i, ++t) {
      const int32_t pos = in.start_pos + static_cast<int32_t>(i);
      token_ids_[t] = in.tokens[i];
      positions_[t] = pos;
      slots_[t] = in.block_table[pos / kv.block_size()] * kv.block_size() + pos % kv.block_size();
      if (mode == LogitsMode::kAll || in.all_logits) out_rows_.push_back(t);
    }
    if (mode == LogitsMode::kLastPerSequence && !in.all_logits) out_rows_.push_back(t - 1);
  }
  query_start_[S] = T;
  AttentionMetadata meta{S, T, query_start_.data(), positions_.data(), slots_.data(),
                         tables_.data(), max_blocks};

  x_.resize(static_cast<size_t>(T) * dim);
  xn_.resize(x_.size());
  proj_.resize(x_.size());
  q_.resize(static_cast<size_t>(T) * qd);
  attn_.resize(q_.size());
  k_.resize(static_cast<size_t>(T) * kvd);
  v_.resize(k_.size());
  gate_.resize(static_cast<size_t>(T) * hid);
  up_.resize(gate_.size());

  Backend& be = *backend_;
  const RopeParams rope{c.head_dim, c.rope_interleaved, cos_sin_.data()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  be.EmbeddingGather(weights_->embed, dim, token_ids_.data(), T, x_.data());
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_->layers[l];
    const PagedKvLayer kv_layer = kv.Layer(l);
    // Attention block.
    be.RmsNorm(x_.data(), w.attn_norm, T, dim, c.norm_eps, xn_.data());
    const Backend::LinearOut qkv[] = {
        {w.wq, w.bq, qd, q_.data()}, {w.wk, w.bk, kvd, k_.data()}, {w.wv, w.bv, kvd, v_.data()}};
    be.MultiLinear(xn_.data(), T, dim, qkv, 3);
    be.Rope(q_.data(), positions_.data(), T, c.num_heads, rope);
    be.Rope(k_.data(), positions_.data(), T, c.num_kv_heads, rope);
    be.KvWrite(kv_layer, k_.data(), v_.data(), meta);
    be.PagedAttention(q_.data(), kv_layer, meta, c.num_heads, scale, attn_.data());
    be.Linear(attn_.data(), w.wo, nullptr, T, dim, qd, proj_.data());
    be.Add(x_.data(), proj_.data(), static_cast<int64_t>(T) * dim);
    // SwiGLU feed-forward block.
    be.RmsNorm(x_.data(), w.ffn_norm, T, dim, c.norm_eps, xn_.data());
    const Backend::LinearOut gate_up[] = {{w.w_gate, nullptr, hid, gate_.data()},
                                          {w.w_up, nullptr, hid, up_.data()}};
    be.MultiLinear(xn_.data(), T, dim, gate_up, 2);
    be.SiluMul(gate_.data(), up_.data(), static_cast<int64_t>(T) * hid, gate_.data());
    be.Linear(gate_.data(), w.w_down, nullptr, T, dim, hid, proj_.data());
    be.Add(x_.data(), proj_.data(), static_cast<int64_t>(T) * dim);
  }
  const int32_t rows = static_cast<int32_t>(out_rows_.size());
  final_.resize(static_cast<size_t>(rows) * dim);
  for (int32_t r = 0; r < rows; ++r) {
    std::memcpy(final_.data() + static_cast<size_t>(r) * dim,
                x_.data() + static_cast<size_t>(out_rows_[r]) * dim, sizeof(float) * dim);
  }
  be.RmsNorm(final_.data(), weights_->final_norm, rows, dim, c.norm_eps, final_.data());
  logits->resize(static_cast<size_t>(rows) * c.vocab_size);
  be.Linear(final_.data(), weights_->lm_head, nullptr, rows, c.vocab_size, dim, logits->data());
  return absl::OkStatus();
}

}  // namespace specula
