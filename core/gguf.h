// GGUF v2/v3 files (llama.cpp's format), memory-mapped: the header's metadata key/values and the
// tensor directory, every count, length, dimension and offset checked against the file size
// before it is used. Errors are one line naming the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "core/quant.h"

namespace specula {

// GGUF metadata value types (the file's ids).
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// One metadata value. Scalars are widened into `i`/`u`/`f` (all three set where meaningful);
// strings and arrays point into the mapping (valid while the GgufFile lives).
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string_view str;             // kString
  GgufType elem_type = GgufType::kU8;  // kArray: element type (arrays of arrays are refused)
  uint64_t count = 0;               // kArray: number of elements
  const uint8_t* data = nullptr;    // kArray of numbers: the packed little-endian elements
  std::vector<std::string_view> strs;  // kArray of strings
};

struct GgufTensor {
  std::string name;
  QuantType type = QuantType::kF32;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the contiguous (row) length
  const uint8_t* data = nullptr;
  int64_t bytes = 0;
  int64_t num_elements() const;
};

class GgufFile {
 public:
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  // nullptr when absent.
  const GgufValue* Find(std::string_view key) const;
  const GgufTensor* FindTensor(std::string_view name) const;
  // Typed lookups: NotFound / InvalidArgument naming the key and the file.
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;   // any integer type
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // f32, f64 or an integer
  // An array of integers or floats, widened.
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<const std::vector<std::string_view>*> GetStringArray(std::string_view key) const;

  // Hands the mapping over (the loader keeps it alive beside the weights that point into it).
  MappedFile TakeFile() { return std::move(file_); }

 private:
  absl::Status Missing(std::string_view key) const;
  absl::Status NotA(std::string_view key, const char* what) const;

  MappedFile file_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensor> tensors_;
};

}  // namespace specula
