#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/ops.h"

namespace specula {
namespace {

constexpr size_t kStagingFloats = size_t{16} << 20;   // weight upload chunk: 64 MiB of float32
constexpr size_t kCublasWorkspace = size_t{32} << 20;  // fixed, so cuBLAS never allocates in a graph
constexpr int32_t kMaxHeadDim = 256;

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

absl::Status CudaError(const char* op, cudaError_t e) {
  return absl::InternalError(absl::StrCat("cuda ", op, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(DType dtype) : dtype_(dtype) {
    // SPECULA_CUDA_GEMV=0 sends m <= 4 products to cuBLAS too (for side-by-side measurements).
    const char* env = std::getenv("SPECULA_CUDA_GEMV");
    use_gemv_ = env == nullptr || std::string(env) != "0";
    // SPECULA_CUDA_FUSE=0 runs MultiLinear's outputs as separate products.
    const char* fuse = std::getenv("SPECULA_CUDA_FUSE");
    fuse_ = fuse == nullptr || std::string(fuse) != "0";
  }

  absl::Status Init(int device) {
    if (auto e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
    if (auto e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaError("cudaStreamCreate", e);
    }
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cuda: cublasCreate failed");
    cublasSetStream(cublas_, stream_);
    if (auto e = cudaMalloc(&workspace_, kCublasWorkspace); e != cudaSuccess) return CudaError("cudaMalloc", e);
    if (cublasSetWorkspace(cublas_, workspace_, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError("cuda: cublasSetWorkspace failed");
    }
    // Split-K attention scratch, fixed (never grown inside a graph capture): splits are only used
    // while (token, head) pairs are fewer than 8 per multiprocessor, so 16 per one always suffice.
    partial_rows_ = 16 * cuda::MultiprocessorCount();
    auto p = Alloc(cuda::PagedAttentionPartialFloats(partial_rows_) * sizeof(float));
    if (!p.ok()) return p.status();
    partials_ = static_cast<float*>(*p);
    return absl::OkStatus();
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    ClearGraphs();
    for (void* p : weights_) cudaFree(p);
    if (staging_ != nullptr) cudaFree(staging_);
    if (partials_ != nullptr) cudaFree(partials_);
    probs_.Reset();
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  DType dtype() const override { return dtype_; }
  bool on_device() const override { return true; }
  void* native_stream() const override { return stream_; }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    void* p = nullptr;
    if (auto e = cudaMalloc(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory error is not sticky; clear it
      return absl::ResourceExhaustedError(
          absl::StrFormat("cuda: cudaMalloc of %d bytes (%.2f GiB): %s", bytes, bytes / 1073741824.0,
                          cudaGetErrorString(e)));
    }
    return p;
  }
  void Free(void* p) override { cudaFree(p); }

  absl::StatusOr<const void*> UploadWeight(const float* host, int64_t n) override {
    auto dst = Alloc(static_cast<size_t>(n) * DTypeBytes(dtype_));
    if (!dst.ok()) return dst.status();
    weights_.push_back(*dst);
    if (dtype_ == DType::kF32) {
      if (auto e = cudaMemcpy(*dst, host, n * sizeof(float), cudaMemcpyHostToDevice); e != cudaSuccess) {
        return CudaError("UploadWeight", e);
      }
      return *dst;
    }
    // Convert on the device, a staging chunk at a time.
    if (staging_ == nullptr) {
      auto s = Alloc(kStagingFloats * sizeof(float));
      if (!s.ok()) return s.status();
      staging_ = static_cast<float*>(*s);
    }
    for (int64_t off = 0; off < n; off += kStagingFloats) {
      const int64_t len = std::min<int64_t>(kStagingFloats, n - off);
      cudaMemcpyAsync(staging_, host + off, len * sizeof(float), cudaMemcpyHostToDevice, stream_);
      cuda::InvokeConvertFromF32(dtype_, staging_, len, static_cast<char*>(*dst) + off * DTypeBytes(dtype_),
                                 stream_);
      Check("UploadWeight");
      // The staging buffer is reused: finish this chunk before the next copy overwrites it.
      if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess) Fail(CudaError("UploadWeight", e));
    }
    if (!status_.ok()) return status_;
    return *dst;
  }

  void CopyIn(void* dst, const void* host, size_t bytes) override {
    if (!status_.ok() || bytes == 0) return;
    if (auto e = cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_); e != cudaSuccess) {
      Fail(CudaError("CopyIn", e));
    }
  }
  void CopyOut(void* host, const void* src, size_t bytes) override {
    if (!status_.ok() || bytes == 0) return;
    if (auto e = cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_); e != cudaSuccess) {
      Fail(CudaError("CopyOut", e));
    }
  }
  absl::Status Sync() override {
    if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess) Fail(CudaError("Sync", e));
    return status_;
  }

  absl::StatusOr<int64_t> KvBudgetBytes(double utilization) override {
    size_t free_b = 0, total_b = 0;
    if (auto e = cudaMemGetInfo(&free_b, &total_b); e != cudaSuccess) return CudaError("cudaMemGetInfo", e);
    const double used = static_cast<double>(total_b - free_b);
    const double budget = utilization * static_cast<double>(total_b) - used;
    if (budget <= 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "gpu_memory_utilization %.2f leaves no room for the KV cache: %.2f GiB of %.2f GiB already in use",
          utilization, used / 1073741824.0, total_b / 1073741824.0));
    }
    return static_cast<int64_t>(budget);
  }

  bool SupportsGraphs() const override { return true; }
  void BeginCapture() override {
    if (!status_.ok()) return;
    if (auto e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
      Fail(CudaError("BeginCapture", e));
    }
  }
  absl::Status EndCapture(int64_t key) override {
    cudaGraph_t graph = nullptr;
    if (auto e = cudaStreamEndCapture(stream_, &graph); e != cudaSuccess) Fail(CudaError("EndCapture", e));
    if (!status_.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return status_;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      Fail(CudaError("cudaGraphInstantiate", e));
      return status_;
    }
    graphs_[key] = exec;
    return absl::OkStatus();
  }
  bool Replay(int64_t key) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end() || !status_.ok()) return false;
    if (auto e = cudaGraphLaunch(it->second, stream_); e != cudaSuccess) Fail(CudaError("cudaGraphLaunch", e));
    return true;
  }
  void ClearGraphs() override {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  void Linear(const void* x, const void* w, const void* bias, int32_t m, int32_t n, int32_t k, void* y) override {
    if (!status_.ok()) return;
    Gemm(x, w, m, n, k, y, CudaType(dtype_), "Linear");
    if (bias != nullptr) {
      cuda::InvokeAddBias(dtype_, y, bias, m, n, stream_);
      Check("Linear bias");
    }
  }
  void LinearF32(const void* x, const void* w, int32_t m, int32_t n, int32_t k, float* y) override {
    if (!status_.ok()) return;
    Gemm(x, w, m, n, k, y, CUDA_R_32F, "LinearF32");
  }
  void MultiLinear(const void* x, int32_t m, int32_t k, const LinearOut* outs, int32_t num_outs) override {
    if (!status_.ok()) return;
    bool fused = use_gemv_ && fuse_ && num_outs <= cuda::kMaxGemvOuts;
    for (int32_t i = 0; i < num_outs; ++i) fused = fused && cuda::GemvApplies(dtype_, x, outs[i].w, m, k);
    if (fused) {  // one launch for q, k, v (or gate, up)
      cuda::GemvOut g[cuda::kMaxGemvOuts];
      for (int32_t i = 0; i < num_outs; ++i) g[i] = {outs[i].w, outs[i].y, outs[i].n};
      cuda::InvokeGemv(dtype_, x, m, k, g, num_outs, false, stream_);
      Check("MultiLinear");
      for (int32_t i = 0; i < num_outs; ++i) {
        if (outs[i].bias != nullptr) {
          cuda::InvokeAddBias(dtype_, outs[i].y, outs[i].bias, m, outs[i].n, stream_);
          Check("MultiLinear bias");
        }
      }
      return;
    }
    for (int32_t i = 0; i < num_outs; ++i) Linear(x, outs[i].w, outs[i].bias, m, outs[i].n, k, outs[i].y);
  }
  void RmsNorm(const void* x, const void* w, int32_t m, int32_t d, float eps, void* y) override {
    if (!status_.ok()) return;
    cuda::InvokeRmsNorm(dtype_, x, w, m, d, eps, y, stream_);
    Check("RmsNorm");
  }
  void AddRmsNorm(void* x, const void* delta, const void* w, int32_t m, int32_t d, float eps, void* y) override {
    if (!status_.ok()) return;
    cuda::InvokeAddRmsNorm(dtype_, x, delta, w, m, d, eps, y, stream_);
    Check("AddRmsNorm");
  }
  void Rope(void* x, const int32_t* positions, int32_t m, int32_t num_heads, const RopeParams& p) override {
    if (!status_.ok()) return;
    cuda::InvokeRope(dtype_, x, positions, m, num_heads, p, stream_);
    Check("Rope");
  }
  void SiluMul(const void* gate, const void* up, int64_t n, void* out) override {
    if (!status_.ok()) return;
    cuda::InvokeSiluMul(dtype_, gate, up, n, out, stream_);
    Check("SiluMul");
  }
  void Add(void* x, const void* y, int64_t n) override {
    if (!status_.ok()) return;
    cuda::InvokeAdd(dtype_, x, y, n, stream_);
    Check("Add");
  }
  void EmbeddingGather(const void* table, int32_t d, const int32_t* ids, int32_t m, void* out) override {
    if (!status_.ok()) return;
    cuda::InvokeEmbeddingGather(dtype_, table, d, ids, m, out, stream_);
    Check("EmbeddingGather");
  }
  void KvWrite(const PagedKvLayer& kv, const void* k, const void* v, const AttentionMetadata& meta) override {
    if (!status_.ok()) return;
    cuda::InvokeKvWrite(dtype_, kv, k, v, meta, stream_);
    Check("KvWrite");
  }
  void PagedAttention(const void* q, const PagedKvLayer& kv, const AttentionMetadata& meta, int32_t num_heads,
                      float scale, void* out) override {
    if (!status_.ok()) return;
    if (kv.head_dim > kMaxHeadDim || kv.num_kv_heads <= 0 || num_heads % kv.num_kv_heads != 0) {
      Fail(absl::InvalidArgumentError(absl::StrCat("cuda PagedAttention: head_dim ", kv.head_dim, " (max ",
                                                   kMaxHeadDim, "), ", num_heads, " heads over ",
                                                   kv.num_kv_heads, " KV heads")));
      return;
    }
    cuda::InvokePagedAttention(dtype_, q, kv, meta, num_heads, scale, out, partials_, partial_rows_, stream_);
    Check("PagedAttention");
  }
  void CopyKvBlocks(const PagedKvLayer& kv, const int32_t* src, const int32_t* dst, int32_t n) override {
    if (!status_.ok()) return;
    cuda::InvokeCopyKvBlocks(dtype_, kv, src, dst, n, stream_);
    Check("CopyKvBlocks");
  }
  void Argmax(const float* logits, int32_t m, int32_t vocab, int32_t* tokens) override {
    if (!status_.ok()) return;
    cuda::InvokeArgmax(logits, m, vocab, tokens, stream_);
    Check("Argmax");
  }
  void Sample(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args, float* probs,
              int32_t* tokens) override {
    if (!status_.ok()) return;
    if (probs == nullptr) {  // scratch for the processed rows, grown on first use
      if (auto st = probs_.Grow(this, static_cast<size_t>(m) * vocab * sizeof(float)); !st.ok()) return Fail(st);
      probs = probs_.as<float>();
    }
    cuda::InvokeSample(logits, m, vocab, args, probs, tokens, stream_);
    Check("Sample");
  }
  void VerifyDrafts(const VerifyArgs& args) override {
    if (!status_.ok()) return;
    cuda::InvokeVerifyDrafts(args, stream_);
    Check("VerifyDrafts");
  }

 private:
  void Fail(absl::Status st) {
    if (status_.ok()) status_ = std::move(st);
  }
  // Records a failed launch (bad configuration, or an earlier asynchronous fault) against `op`.
  void Check(const char* op) {
    if (auto e = cudaGetLastError(); e != cudaSuccess) Fail(CudaError(op, e));
  }

  // Row-major y[m, n] = x[m, k] w[n, k]^T as the column-major y^T = w x^T.
  void Gemm(const void* x, const void* w, int32_t m, int32_t n, int32_t k, void* y, cudaDataType_t out_type,
            const char* op) {
    if (m == 0) return;
    if (use_gemv_ && cuda::GemvApplies(dtype_, x, w, m, k)) {
      const cuda::GemvOut out{w, y, n};
      cuda::InvokeGemv(dtype_, x, m, k, &out, 1, out_type == CUDA_R_32F, stream_);
      Check(op);
      return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t t = CudaType(dtype_);
    const cublasStatus_t st = cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, t, k, x, t, k,
                                           &beta, y, out_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      Fail(absl::InternalError(absl::StrCat("cuda ", op, ": cublasGemmEx(m=", m, ", n=", n, ", k=", k, ") failed: ",
                                            cublasGetStatusString(st))));
    }
  }

  DType dtype_;
  bool use_gemv_ = true;
  bool fuse_ = true;
  absl::Status status_;  // the first failure, naming the op; sticky
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* workspace_ = nullptr;            // [kCublasWorkspace] bytes
  float* staging_ = nullptr;             // [kStagingFloats] weight upload chunk
  float* partials_ = nullptr;            // [partial_rows_, head_dim + 2] split-K attention scratch
  int32_t partial_rows_ = 0;
  BackendBuffer probs_;                  // [m, vocab] f32 Sample scratch
  std::vector<void*> weights_;           // uploaded weights, freed with the backend
  std::map<int64_t, cudaGraphExec_t> graphs_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<double> MeasureCopyBandwidthGBs(int device, size_t bytes) {
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
  void *a = nullptr, *b = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  absl::Status st;
  float ms = 0;
  constexpr int kReps = 20;
  auto check = [&](const char* op, cudaError_t e) {
    if (e != cudaSuccess && st.ok()) st = CudaError(op, e);
  };
  check("cudaMalloc", cudaMalloc(&a, bytes));
  check("cudaMalloc", cudaMalloc(&b, bytes));
  check("cudaEventCreate", cudaEventCreate(&start));
  check("cudaEventCreate", cudaEventCreate(&stop));
  if (st.ok()) {
    check("cudaMemcpy", cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
    check("cudaEventRecord", cudaEventRecord(start));
    for (int i = 0; i < kReps; ++i) check("cudaMemcpy", cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice));
    check("cudaEventRecord", cudaEventRecord(stop));
    check("cudaEventSynchronize", cudaEventSynchronize(stop));
    check("cudaEventElapsedTime", cudaEventElapsedTime(&ms, start, stop));
  }
  if (a != nullptr) cudaFree(a);
  if (b != nullptr) cudaFree(b);
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (!st.ok()) return st;
  return 2.0 * static_cast<double>(bytes) * kReps / (ms / 1e3) / 1e9;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  int n = 0;
  if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device cuda: no CUDA device is available (",
        e != cudaSuccess ? absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)) : "0 devices", ")"));
  }
  if (options.device < 0 || options.device >= n) {
    return absl::InvalidArgumentError(absl::StrCat("cuda device ", options.device, " out of range: ", n, " present"));
  }
  auto backend = std::make_unique<CudaBackend>(options.dtype);
  if (auto st = backend->Init(options.device); !st.ok()) return st;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace specula
