#include "draft/self_draft.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace specula {

absl::StatusOr<std::unique_ptr<ModelWeights>> LayerSkipDraftWeights(const std::string& target_path,
                                                                    int32_t num_layers) {
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> w, LoadModel(target_path));
  const int32_t total = w->config.num_layers;
  if (num_layers < 1 || num_layers >= total) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-layers must be in [1, ", total - 1, "] for ", target_path,
                                                   " (", total, " layers), got ", num_layers));
  }
  w->layers.resize(num_layers);
  w->config.num_layers = num_layers;
  return w;
}

namespace {

// `m` [rows, cols] requantized to `type` into storage owned by `w`.
Matrix Requantize(ModelWeights& w, const Matrix& m, int64_t rows, int64_t cols, QuantType type) {
  if (m.data == nullptr || m.type == type || cols % kQK != 0) return m;
  std::vector<uint8_t>& out = w.owned_blocks.emplace_back(static_cast<size_t>(rows * QuantRowBytes(type, cols)));
  std::vector<float> row(cols);  // [cols]
  const int64_t in_bytes = QuantRowBytes(m.type, cols), out_bytes = QuantRowBytes(type, cols);
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(m.type, static_cast<const uint8_t*>(m.data) + r * in_bytes, cols, row.data());
    uint8_t* dst = out.data() + r * out_bytes;
    switch (type) {
      case QuantType::kQ8_0: QuantizeRowQ8_0(row.data(), cols, reinterpret_cast<BlockQ8_0*>(dst)); break;
      case QuantType::kQ4_0: QuantizeRowQ4_0(row.data(), cols, reinterpret_cast<BlockQ4_0*>(dst)); break;
      default: QuantizeRowQ4_1(row.data(), cols, reinterpret_cast<BlockQ4_1*>(dst)); break;
    }
  }
  return Matrix(out.data(), type);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> SelfQuantDraftWeights(const std::string& target_path, QuantType type) {
  if (type != QuantType::kQ8_0 && type != QuantType::kQ4_0 && type != QuantType::kQ4_1) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-quant-type ", QuantTypeName(type),
                                                   " is not supported (q8_0, q4_0, q4_1)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> w, LoadModel(target_path));
  const ModelConfig& c = w->config;
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  const bool tied = w->lm_head == w->embed;
  w->embed = Requantize(*w, w->embed, v, d, type);
  w->lm_head = tied ? w->embed : Requantize(*w, w->lm_head, v, d, type);
  for (LayerWeights& l : w->layers) {
    l.wq = Requantize(*w, l.wq, q, d, type);
    l.wk = Requantize(*w, l.wk, kv, d, type);
    l.wv = Requantize(*w, l.wv, kv, d, type);
    l.wo = Requantize(*w, l.wo, d, q, type);
    l.w_gate = Requantize(*w, l.w_gate, h, d, type);
    l.w_up = Requantize(*w, l.w_up, h, d, type);
    l.w_down = Requantize(*w, l.w_down, d, h, type);
  }
  return w;
}

}  // namespace specula
