// Per-row arguments of Backend::Sample, built on the host and copied to the backend in one piece:
// temperature, top-k, top-p, the draw and the row of probs each row's distribution goes to.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/backend.h"

namespace specula {

// A uniform [0, 1) draw as the kernels take it: float, never rounded up to 1.
inline float KernelDraw(double u) { return std::min(static_cast<float>(u), std::nextafter(1.0f, 0.0f)); }

class SampleRows {
 public:
  // `rows` rows at greedy settings (temperature 0, no top-k or top-p, draw 0, probs row = row).
  void Reset(int32_t rows) {
    rows_ = rows;
    words_.assign(5 * static_cast<size_t>(rows), 0);
    for (int32_t r = 0; r < rows; ++r) {
      Put(kTopP, r, 1.0f);
      Put(kProbsRow, r, r);
    }
  }
  void Set(int32_t row, float temperature, int32_t top_k, float top_p) {
    Put(kTemperature, row, temperature);
    Put(kTopK, row, top_k);
    Put(kTopP, row, top_p);
  }
  void SetDraw(int32_t row, double u) { Put(kDraw, row, KernelDraw(u)); }  // u in [0, 1)
  void SetProbsRow(int32_t row, int32_t probs_row) { Put(kProbsRow, row, probs_row); }

  // Copies the rows in; the arguments point into this object's backend buffer until the next call.
  absl::StatusOr<SampleArgs> Upload(Backend* be) {
    if (auto st = dev_.Grow(be, std::max<size_t>(words_.size(), 1) * 4); !st.ok()) return st;
    be->CopyIn(dev_.get(), words_.data(), words_.size() * 4);
    const uint32_t* w = dev_.as<uint32_t>();
    auto at = [&](Field f) { return w + static_cast<size_t>(f) * rows_; };
    return SampleArgs{reinterpret_cast<const float*>(at(kTemperature)), reinterpret_cast<const int32_t*>(at(kTopK)),
                      reinterpret_cast<const float*>(at(kTopP)), reinterpret_cast<const float*>(at(kDraw)),
                      reinterpret_cast<const int32_t*>(at(kProbsRow))};
  }

 private:
  enum Field { kTemperature, kTopK, kTopP, kDraw, kProbsRow };
  template <typename T>
  void Put(Field f, int32_t row, T v) {
    static_assert(sizeof(T) == 4);
    std::memcpy(&words_[static_cast<size_t>(f) * rows_ + row], &v, 4);
  }

  int32_t rows_ = 0;
  std::vector<uint32_t> words_;  // [5, rows] 4-byte words, one field after another
  BackendBuffer dev_;
};

}  // namespace specula
