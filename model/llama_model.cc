#include "model/llama_model.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "dist/communicator.h"

namespace specula {
namespace {

uint64_t NextModelId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Batches of captured steps are padded up to one of these sizes so a few graphs cover them all.
constexpr int32_t kGraphBatches[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};

// Tokens per sequence up to which a step is captured: a verification of up to 15 drafts.
constexpr int32_t kMaxGraphTokens = 16;

int32_t GraphBatch(int32_t seqs, int32_t max_graph_batch) {
  for (int32_t b : kGraphBatches) {
    if (b >= seqs) return b <= max_graph_batch ? b : 0;
  }
  return 0;
}

}  // namespace

LlamaModel::LlamaModel(std::unique_ptr<ModelWeights> weights, std::unique_ptr<Backend> backend,
                       std::shared_ptr<Communicator> comm)
    : weights_(std::move(weights)), backend_(std::move(backend)), kv_dtype_(backend_->dtype()),
      comm_(std::move(comm)), id_(NextModelId()) {
  if (comm_ != nullptr && comm_->size() != weights_->shard.size) {
    status_ = absl::InvalidArgumentError(absl::StrCat("the weights are cut for ", weights_->shard.size,
                                                      " ranks but the communicator has ", comm_->size()));
    return;
  }
  if (tp()) max_graph_batch_ = 0;  // graphs would capture the collectives
  status_ = Upload();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(std::unique_ptr<ModelWeights> weights,
                                                               std::unique_ptr<Backend> backend,
                                                               std::shared_ptr<Communicator> comm) {
  auto model = std::make_unique<LlamaModel>(std::move(weights), std::move(backend), std::move(comm));
  if (!model->status().ok()) return model->status();
  return model;
}

LlamaModel::~LlamaModel() {
  if (!tp() || comm_->rank() != 0) return;
  StepMessage stop;
  stop.op = StepMessage::kStop;
  std::string bytes = EncodeStepMessage(stop);
  (void)comm_->BroadcastMessage(&bytes, "stop");  // a broken group has already failed loudly
}

absl::Status LlamaModel::Upload() {
  const ModelConfig& c = weights_->config;
  Backend& be = *backend_;
  absl::Status st;
  // One upload per tensor; a null view (absent bias) stays null; the first error is kept. A tensor
  // the backend copied (packed, quantized, or on a device) is released from host memory, so that
  // the process holds one copy of the weights: at once on the host (so that the peak holds one
  // tensor twice, not the model), after the final Sync on a device.
  std::vector<std::pair<const void*, size_t>> copied;
  auto keep = [&](const void* host, size_t bytes, auto upload) -> const void* {
    if (host == nullptr || !st.ok()) return nullptr;
    absl::StatusOr<const void*> r = upload();
    if (!r.ok()) st = r.status();
    if (r.ok() && *r != host) {
      if (be.on_device()) {
        copied.push_back({host, bytes});
      } else {
        weights_->Release(host, bytes);
      }
    }
    return r.ok() ? *r : nullptr;
  };
  auto up = [&](const float* host, int64_t n) {
    return keep(host, n * sizeof(float), [&] { return be.UploadWeight(host, n); });
  };
  // Matrices (read only by the Linear ops and the embedding lookup) may be stored in a format of
  // the backend's own; GGUF blocks go to the backend as they are.
  auto mat = [&](const Matrix& m, int64_t rows, int64_t cols) {
    if (m.type == QuantType::kF32) {
      return keep(m.data, rows * cols * sizeof(float), [&] { return be.UploadMatrix(m.f32(), rows, cols); });
    }
    return keep(m.data, rows * QuantRowBytes(m.type, cols),
                [&] { return be.UploadQuantMatrix(m.data, m.type, rows, cols); });
  };
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  embed_ = mat(weights_->embed, c.vocab_size, dim);
  for (const LayerWeights& w : weights_->layers) {
    layers_.push_back(Layer{up(w.attn_norm, dim), mat(w.wq, qd, dim), mat(w.wk, kvd, dim), mat(w.wv, kvd, dim),
                            up(w.bq, qd), up(w.bk, kvd), up(w.bv, kvd), mat(w.wo, dim, qd), up(w.ffn_norm, dim),
                            mat(w.w_gate, hid, dim), mat(w.w_up, hid, dim), mat(w.w_down, dim, hid)});
  }
  final_norm_ = up(weights_->final_norm, dim);
  const TpShard& sh = weights_->shard;
  lm_head_ = weights_->lm_head == weights_->embed && !sh.active()
                 ? embed_
                 : mat(weights_->lm_head, sh.active() ? sh.vocab_end - sh.vocab_begin : c.vocab_size, dim);
  RETURN_IF_ERROR(st);

  std::vector<float> cos_sin(static_cast<size_t>(c.max_seq_len) * c.head_dim);  // [max_seq_len, head_dim]
  const std::vector<float> inv_freq = RopeInvFreq(c);                            // [head_dim / 2]
  const int32_t half = c.head_dim / 2;
  for (int32_t pos = 0; pos < c.max_seq_len; ++pos) {
    float* row = cos_sin.data() + static_cast<size_t>(pos) * c.head_dim;
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[i];
      row[i] = static_cast<float>(std::cos(angle));
      row[half + i] = static_cast<float>(std::sin(angle));
    }
  }
  RETURN_IF_ERROR(cos_sin_.Grow(&be, cos_sin.size() * sizeof(float)));
  be.CopyIn(cos_sin_.get(), cos_sin.data(), cos_sin.size() * sizeof(float));
  RETURN_IF_ERROR(be.Sync());
  for (const auto& [host, bytes] : copied) weights_->Release(host, bytes);
  // The column cuts of a tensor-parallel shard were heap copies, freed once packed; glibc keeps
  // freed chunks of that size in the heap, which would hold about their total in RSS. Ranks that
  // are threads trim one at a time: under a sanitizer's allocator glibc's heap is first set up by
  // this call, and two first calls at once race on that setup.
  if (weights_->shard.active()) {
    static std::mutex trim_mu;
    std::lock_guard<std::mutex> lock(trim_mu);
    ::malloc_trim(0);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::set_kv_dtype(DType d) {
  if (!backend_->SupportsKvDtype(d)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype ", DTypeName(d), " is not supported by the ",
                                                   backend_->name(), " backend computing in ",
                                                   DTypeName(backend_->dtype())));
  }
  kv_dtype_ = d;
  return absl::OkStatus();
}

absl::Status LlamaModel::Validate(const ForwardBatch& batch, const KvCache& kv) const {
  const ModelConfig& c = config();
  if (!kv.status().ok()) return kv.status();
  if (!backend_->SupportsKvDtype(kv.dtype()) || (backend_->on_device() && kv.backend() != backend_.get())) {
    return absl::InvalidArgumentError(absl::StrCat("the KV cache (", DTypeName(kv.dtype()),
                                                   ") was not allocated for the model's backend (",
                                                   backend_->name(), ", ", DTypeName(backend_->dtype()), ")"));
  }
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

absl::Status LlamaModel::Reserve(int32_t tokens, int32_t seqs, int32_t table_len, int32_t rows) {
  if (tokens <= cap_tokens_ && seqs <= cap_seqs_ && table_len <= cap_table_ && rows <= cap_rows_) {
    return absl::OkStatus();
  }
  cap_tokens_ = std::max(cap_tokens_, tokens);
  cap_seqs_ = std::max(cap_seqs_, seqs);
  cap_table_ = std::max(cap_table_, table_len);
  cap_rows_ = std::max(cap_rows_, rows);
  const size_t R = cap_rows_;
  const ModelConfig& c = config();
  const size_t T = cap_tokens_, e = DTypeBytes(backend_->dtype()), i32 = sizeof(int32_t);
  Backend* be = backend_.get();
  RETURN_IF_ERROR(meta_dev_.Grow(be, (3 * T + cap_seqs_ + 1 + std::max(cap_table_, 1) + R) * i32));
  RETURN_IF_ERROR(x_.Grow(be, T * c.dim * e));
  RETURN_IF_ERROR(xn_.Grow(be, T * c.dim * e));
  RETURN_IF_ERROR(proj_.Grow(be, T * c.dim * e));
  RETURN_IF_ERROR(final_.Grow(be, R * c.dim * e));
  RETURN_IF_ERROR(q_.Grow(be, T * c.q_dim() * e));
  RETURN_IF_ERROR(attn_.Grow(be, T * c.q_dim() * e));
  RETURN_IF_ERROR(k_.Grow(be, T * c.kv_dim() * e));
  RETURN_IF_ERROR(v_.Grow(be, T * c.kv_dim() * e));
  RETURN_IF_ERROR(gate_.Grow(be, T * c.hidden_dim * e));
  RETURN_IF_ERROR(up_.Grow(be, T * c.hidden_dim * e));
  if (be->on_device()) RETURN_IF_ERROR(logits_dev_.Grow(be, R * c.vocab_size * sizeof(float)));
  be->ClearGraphs();  // captured graphs point at the old buffers
  return absl::OkStatus();
}

void LlamaModel::Run(int32_t T, int32_t S, int32_t rows, int32_t max_blocks, KvCache& kv) {
  const ModelConfig& c = config();
  const int32_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  Backend& be = *backend_;
  const int32_t* positions = dev_meta_.positions;
  const AttentionMetadata meta{S, T, dev_meta_.query_start, positions, dev_meta_.slots, dev_meta_.tables, max_blocks};
  const RopeParams rope{c.head_dim, c.rope_interleaved, cos_sin_.as<float>()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  void *x = x_.get(), *xn = xn_.get(), *q = q_.get(), *k = k_.get(), *v = v_.get(), *attn = attn_.get(),
       *proj = proj_.get(), *gate = gate_.get(), *up = up_.get();

  be.EmbeddingGather(embed_, dim, dev_meta_.ids, T, x);
  be.RmsNorm(x, layers_[0].attn_norm, T, dim, c.norm_eps, xn);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const Layer& w = layers_[l];
    const PagedKvLayer kv_layer = kv.Layer(l);
    // Attention block.
    const Backend::LinearOut qkv[] = {{w.wq, w.bq, qd, q}, {w.wk, w.bk, kvd, k}, {w.wv, w.bv, kvd, v}};
    be.MultiLinear(xn, T, dim, qkv, 3);
    be.Rope(q, positions, T, c.num_heads, rope);
    be.Rope(k, positions, T, c.num_kv_heads, rope);
    be.KvWrite(kv_layer, k, v, meta);
    be.PagedAttention(q, kv_layer, meta, c.num_heads, scale, attn);
    be.Linear(attn, w.wo, nullptr, T, dim, qd, proj);
    AllReduce(proj, static_cast<int64_t>(T) * dim, l, "o_proj");
    be.AddRmsNorm(x, proj, w.ffn_norm, T, dim, c.norm_eps, xn);
    // SwiGLU feed-forward block; its residual add is fused with the next layer's norm.
    const Backend::LinearOut gate_up[] = {{w.w_gate, nullptr, hid, gate}, {w.w_up, nullptr, hid, up}};
    be.MultiLinear(xn, T, dim, gate_up, 2);
    be.SiluMul(gate, up, static_cast<int64_t>(T) * hid, gate);
    be.Linear(gate, w.w_down, nullptr, T, dim, hid, proj);
    AllReduce(proj, static_cast<int64_t>(T) * dim, l, "down");
    if (l + 1 < c.num_layers) {
      be.AddRmsNorm(x, proj, layers_[l + 1].attn_norm, T, dim, c.norm_eps, xn);
    } else {
      be.Add(x, proj, static_cast<int64_t>(T) * dim);
    }
  }
  be.EmbeddingGather(x, dim, dev_meta_.rows, rows, final_.get());  // rows whose logits return
  be.RmsNorm(final_.get(), final_norm_, rows, dim, c.norm_eps, final_.get());
}

void LlamaModel::AllReduce(void* x, int64_t n, int32_t layer, const char* what) {
  if (!tp() || !tp_status_.ok()) return;
  tp_status_ = comm_->AllReduceSum(x, n, backend_->dtype(), absl::StrCat("layer ", layer, " ", what));
}

void LlamaModel::Classify(int32_t rows, float* logits_out, std::vector<float>* logits) {
  const ModelConfig& c = config();
  Backend& be = *backend_;
  if (!tp()) return be.LinearF32(final_.get(), lm_head_, rows, c.vocab_size, c.dim, logits_out);
  // Each rank's slice [rows, its vocab rows] (padded to vocab_stride), gathered in rank order.
  const TpShard& sh = shard();
  const size_t chunk = static_cast<size_t>(rows) * sh.vocab_stride * sizeof(float);
  tp_status_.Update(tp_local_.Grow(&be, chunk));
  tp_status_.Update(tp_gather_.Grow(&be, chunk * sh.size));
  if (!tp_status_.ok()) return;
  be.LinearF32(final_.get(), lm_head_, rows, sh.vocab_end - sh.vocab_begin, c.dim, tp_local_.as<float>());
  tp_status_.Update(be.Sync());
  if (!tp_status_.ok()) return;
  tp_status_ = comm_->AllGather(tp_local_.get(), chunk, tp_gather_.get(), "logits");
  if (!tp_status_.ok() || comm_->rank() != 0) return;
  const float* all = tp_gather_.as<float>();
  if (be.on_device()) {
    tp_gather_host_.resize(chunk * sh.size / sizeof(float));
    be.CopyOut(tp_gather_host_.data(), all, chunk * sh.size);
    tp_status_.Update(be.Sync());
    all = tp_gather_host_.data();
  }
  for (int32_t r = 0; r < sh.size; ++r) {
    const int32_t v0 = std::min(c.vocab_size, r * sh.vocab_stride);
    const int32_t vn = std::min(c.vocab_size, (r + 1) * sh.vocab_stride) - v0;
    const float* src = all + static_cast<size_t>(r) * rows * sh.vocab_stride;  // [rows, vn]
    for (int32_t i = 0; i < rows; ++i) {
      std::memcpy(logits->data() + static_cast<size_t>(i) * c.vocab_size + v0, src + static_cast<size_t>(i) * vn,
                  vn * sizeof(float));
    }
  }
}

absl::Status LlamaModel::SendStep(const ForwardBatch& batch, const KvCache& kv, LogitsMode mode) {
  StepMessage m = ForwardMessage(batch);
  m.pool_id = kv.id();
  m.block_size = kv.block_size();
  m.num_blocks = kv.num_blocks();
  m.kv_dtype = kv.dtype();
  m.logits_mode = static_cast<uint8_t>(mode);
  if (announced_pools_.insert(kv.id()).second) {
    const_cast<KvCache&>(kv).set_on_destroy([released = released_](uint64_t id) {
      std::lock_guard<std::mutex> lock(released->mu);
      released->ids.push_back(id);
    });
  }
  {
    std::lock_guard<std::mutex> lock(released_->mu);
    m.released_pools.swap(released_->ids);
  }
  for (uint64_t id : m.released_pools) announced_pools_.erase(id);
  std::string bytes = EncodeStepMessage(m);
  return comm_->BroadcastMessage(&bytes, "step plan");
}

absl::Status LlamaModel::RunFollower() {
  RETURN_IF_ERROR(status_);
  if (!tp() || comm_->rank() == 0) return absl::FailedPreconditionError("RunFollower is for ranks other than 0");
  std::vector<float> logits;
  for (;;) {
    std::string bytes;
    RETURN_IF_ERROR(comm_->BroadcastMessage(&bytes, "step plan"));
    StepMessage m;
    RETURN_IF_ERROR(DecodeStepMessage(bytes, &m));
    for (uint64_t id : m.released_pools) pools_.erase(id);
    if (m.op == StepMessage::kStop) return absl::OkStatus();
    std::unique_ptr<KvCache>& pool = pools_[m.pool_id];
    if (pool == nullptr) {
      pool = std::make_unique<KvCache>(config(), KvCacheConfig{m.block_size, m.num_blocks, m.kv_dtype}, backend_.get());
      RETURN_IF_ERROR(pool->status());
    }
    const ForwardBatch batch = m.Batch();
    RETURN_IF_ERROR(Validate(batch, *pool));
    RETURN_IF_ERROR(ForwardLocal(batch, *pool, static_cast<LogitsMode>(m.logits_mode), &logits));
  }
}

LlamaModel::GraphShape LlamaModel::GraphShapeOf(const ForwardBatch& batch, LogitsMode mode) const {
  GraphShape g;
  if (mode != LogitsMode::kLastPerSequence || !backend_->SupportsGraphs() || batch.seqs.empty()) return g;
  for (const auto& s : batch.seqs) {
    g.tokens = std::max<int32_t>(g.tokens, s.tokens.size());
    g.all_rows = g.all_rows || s.all_logits;
  }
  if (g.tokens > kMaxGraphTokens) return GraphShape{};
  g.seqs = GraphBatch(static_cast<int32_t>(batch.seqs.size()), max_graph_batch_);
  return g;
}

// Flattens the batch into the step's host metadata: token ids, positions, KV slots, padded block
// tables and the rows whose logits are computed, real rows first in batch order. In a graph shape
// every sequence has g.tokens tokens: a real one's padding repeats its last position with slot -1
// (no K/V written, output zero); a padding sequence sits at position 0 with an empty table. Returns
// the real rows; out_rows_ holds the rows computed.
int32_t LlamaModel::Flatten(const ForwardBatch& batch, const KvCache& kv, LogitsMode mode, const GraphShape& g,
                            int32_t T, int32_t S, int32_t max_blocks) {
  token_ids_.assign(T, 0);
  positions_.assign(T, 0);
  slots_.assign(T, -1);
  query_start_.resize(S + 1);
  tables_.assign(static_cast<size_t>(S) * max_blocks, -1);
  out_rows_.clear();
  int32_t t = 0;
  for (int32_t s = 0; s < S; ++s) {
    query_start_[s] = t;
    if (s >= static_cast<int32_t>(batch.seqs.size())) {
      t += g.tokens;
      continue;
    }
    const SequenceInput& in = batch.seqs[s];
    std::copy(in.block_table.begin(), in.block_table.end(), tables_.begin() + static_cast<size_t>(s) * max_blocks);
    for (size_t i = 0; i < in.tokens.size(); ++i, ++t) {
      const int32_t pos = in.start_pos + static_cast<int32_t>(i);
      token_ids_[t] = in.tokens[i];
      positions_[t] = pos;
      slots_[t] = in.block_table[pos / kv.block_size()] * kv.block_size() + pos % kv.block_size();
      if (mode == LogitsMode::kAll || in.all_logits) out_rows_.push_back(t);
    }
    if (mode == LogitsMode::kLastPerSequence && !in.all_logits) out_rows_.push_back(t - 1);
    if (g.seqs == 0) continue;
    for (int32_t pad = static_cast<int32_t>(in.tokens.size()); pad < g.tokens; ++pad, ++t) positions_[t] = positions_[t - 1];
  }
  query_start_[S] = T;
  const int32_t rows = static_cast<int32_t>(out_rows_.size());
  const int32_t run_rows = g.seqs == 0 ? rows : g.all_rows ? T : g.seqs;
  while (static_cast<int32_t>(out_rows_.size()) < run_rows) out_rows_.push_back(static_cast<int32_t>(out_rows_.size()));
  return rows;
}

void LlamaModel::CopyMetaIn() {
  meta_.clear();
  const int32_t* base = meta_dev_.as<int32_t>();
  const int32_t* at[6];
  int i = 0;
  for (const std::vector<int32_t>* v : {&token_ids_, &positions_, &slots_, &query_start_, &tables_, &out_rows_}) {
    at[i++] = base + meta_.size();
    meta_.insert(meta_.end(), v->begin(), v->end());
  }
  dev_meta_ = {at[0], at[1], at[2], at[3], at[4], at[5]};
  backend_->CopyIn(meta_dev_.get(), meta_.data(), meta_.size() * sizeof(int32_t));
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, KvCache& kv, LogitsMode mode,
                                 std::vector<float>* logits) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(Validate(batch, kv));
  if (tp()) {
    if (comm_->rank() != 0) return absl::FailedPreconditionError("only rank 0 calls Forward; the others RunFollower");
    RETURN_IF_ERROR(SendStep(batch, kv, mode));
  }
  return ForwardLocal(batch, kv, mode, logits);
}

absl::Status LlamaModel::ForwardLocal(const ForwardBatch& batch, KvCache& kv, LogitsMode mode,
                                      std::vector<float>* logits) {
  const ModelConfig& c = config();
  Backend& be = *backend_;
  int32_t T = batch.NumTokens();
  int32_t S = static_cast<int32_t>(batch.seqs.size());

  // Steps of few tokens per sequence (decode: 1; verification: 1 + drafts; a draft's catch-up)
  // replay a graph captured for the batch padded to a bucket of sequences of equal length, with
  // block tables padded to the full context.
  const GraphShape g = GraphShapeOf(batch, mode);
  int32_t max_blocks = 0;
  for (const auto& s : batch.seqs) max_blocks = std::max<int32_t>(max_blocks, s.block_table.size());
  if (g.seqs > 0) {
    // No sequence can hold more blocks than the pool has.
    max_blocks = std::min((c.max_seq_len + kv.block_size() - 1) / kv.block_size(), kv.num_blocks());
    S = g.seqs;
    T = g.seqs * g.tokens;
  }
  const int32_t rows = Flatten(batch, kv, mode, g, T, S, max_blocks);
  const int32_t run_rows = static_cast<int32_t>(out_rows_.size());
  RETURN_IF_ERROR(Reserve(T, S, S * max_blocks, run_rows));
  CopyMetaIn();

  if (logits == nullptr && !logits_stay_in_backend()) {
    return absl::FailedPreconditionError("logits cannot stay on a device under tensor parallelism");
  }
  std::vector<float>* host = logits != nullptr ? logits : &own_logits_;  // [rows, vocab]
  if (logits != nullptr || !be.on_device() || tp()) host->resize(static_cast<size_t>(rows) * c.vocab_size);
  float* logits_out = be.on_device() ? logits_dev_.as<float>() : host->data();
  if (g.seqs > 0) {
    if (graph_kv_ != kv.id()) {  // not the address: a new pool can take a freed one's
      be.ClearGraphs();
      graph_kv_ = kv.id();
    }
    if (!be.Replay(g.key())) {
      be.BeginCapture();
      Run(T, S, run_rows, max_blocks, kv);
      Classify(run_rows, logits_out, host);
      RETURN_IF_ERROR(be.EndCapture(g.key()));
      if (!be.Replay(g.key())) return absl::InternalError("captured graph did not replay");
    }
  } else {
    Run(T, S, run_rows, max_blocks, kv);
    Classify(run_rows, logits_out, host);
  }
  RETURN_IF_ERROR(tp_status_);
  if (be.on_device() && !tp() && logits != nullptr) {
    be.CopyOut(logits->data(), logits_out, logits->size() * sizeof(float));
  }
  // Logits left on a device are read by the next op on its stream, which waits for them: the host
  // need not. A failure shows at the next Sync.
  if (logits == nullptr && be.on_device()) return absl::OkStatus();
  return be.Sync();
}

}  // namespace specula
