// Helpers for the GPU differential tests: moving float32 host data in and out of a backend in its
// dtype, poisoned outputs, and error bounds per dtype.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/make_backend.h"

namespace specula::testing {

// Skips the test (reported as skipped by CTest, never as passed) when no GPU is present.
#define SPECULA_REQUIRE_GPU()                                                   \
  do {                                                                          \
    if (::specula::CudaDevices() == 0) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

inline std::vector<float> RandomVec(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Rounds values to what `dtype` can hold, so both backends start from identical inputs.
inline std::vector<float> Quantize(std::vector<float> v, DType dtype) {
  for (float& x : v) {
    if (dtype == DType::kBF16) x = Bf16ToF32(F32ToBf16(x));
    if (dtype == DType::kF16) x = F16ToF32(F32ToF16(x));
  }
  return v;
}

// Relative error bound (against max |reference|) for outputs stored in `dtype`.
inline double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 2e-5;
    case DType::kF16: return 4e-3;
    case DType::kBF16: return 3e-2;
  }
  return 0;
}

// A tensor in a backend's memory, freed with the holder.
class DevTensor {
 public:
  DevTensor(Backend& be, int64_t n, size_t elem) : be_(&be), bytes_(n * elem) {
    auto p = be.Alloc(bytes_);
    EXPECT_TRUE(p.ok()) << p.status();
    p_ = p.ok() ? *p : nullptr;
    Poison();
  }
  ~DevTensor() {
    if (p_ != nullptr) be_->Free(p_);
  }
  DevTensor(const DevTensor&) = delete;
  DevTensor& operator=(const DevTensor&) = delete;
  // All bytes 0xff: NaN in f32, f16 and bf16, so an element an op forgot to write shows up.
  void Poison() {
    std::vector<uint8_t> ff(bytes_, 0xff);
    be_->CopyIn(p_, ff.data(), bytes_);
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  Backend* be_;
  size_t bytes_;
  void* p_ = nullptr;
};

// Float32 host values -> a tensor of the backend's dtype.
inline std::unique_ptr<DevTensor> ToBackend(Backend& be, const std::vector<float>& host) {
  auto t = std::make_unique<DevTensor>(be, static_cast<int64_t>(host.size()), DTypeBytes(be.dtype()));
  std::vector<uint16_t> half(host.size());
  const void* src = host.data();
  if (be.dtype() != DType::kF32) {
    for (size_t i = 0; i < host.size(); ++i) half[i] = be.dtype() == DType::kBF16 ? F32ToBf16(host[i]) : F32ToF16(host[i]);
    src = half.data();
  }
  be.CopyIn(t->get(), src, host.size() * DTypeBytes(be.dtype()));
  return t;
}

template <typename T>
std::unique_ptr<DevTensor> RawToBackend(Backend& be, const std::vector<T>& host) {
  auto t = std::make_unique<DevTensor>(be, static_cast<int64_t>(host.size()), sizeof(T));
  be.CopyIn(t->get(), host.data(), host.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> RawFromBackend(Backend& be, const void* p, int64_t n) {
  std::vector<T> out(n);
  be.CopyOut(out.data(), p, n * sizeof(T));
  const absl::Status st = be.Sync();
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// n elements of the backend's dtype (or float32 when `f32`) -> float32 host values.
inline std::vector<float> FromBackend(Backend& be, const void* p, int64_t n, bool f32 = false) {
  const DType dt = f32 ? DType::kF32 : be.dtype();
  if (dt == DType::kF32) return RawFromBackend<float>(be, p, n);
  const std::vector<uint16_t> half = RawFromBackend<uint16_t>(be, p, n);
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = dt == DType::kBF16 ? Bf16ToF32(half[i]) : F16ToF32(half[i]);
  return out;
}

// Every value finite and within tol * max(|ref|, 1e-3) of the reference.
inline void ExpectClose(const std::vector<float>& ref, const std::vector<float>& got, double tol,
                        const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  double scale = 1e-3;
  for (float r : ref) scale = std::max(scale, static_cast<double>(std::fabs(r)));
  double worst = 0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i] << " (reference " << ref[i] << ")";
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (err > worst) {
      worst = err;
      worst_i = static_cast<int64_t>(i);
    }
  }
  EXPECT_LE(worst / scale, tol) << what << ": worst element " << worst_i << " got " << got[worst_i] << " want "
                                << ref[worst_i] << " (relative error " << worst / scale << ")";
}

}  // namespace specula::testing
