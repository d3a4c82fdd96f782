// Reader and writer for the safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then the raw tensor bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/mapped_file.h"

namespace specula {

// The header's dtype names: "F32", "F16", "BF16".
absl::StatusOr<DType> ParseSafetensorsDType(const std::string& name);
const char* SafetensorsDTypeName(DType d);

struct TensorEntry {
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file
  int64_t num_bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps the file and checks every entry: known dtype, offsets inside the data section, and byte
  // size equal to the product of the shape times the dtype size.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }
  MappedFile TakeFile() { return std::move(file_); }

 private:
  MappedFile file_;
  std::map<std::string, TensorEntry> tensors_;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t NumElements() const;
};

// Writes tensors one at a time: `fill(i, out)` fills specs[i] as float32 [numel], which is then
// converted to `dtype`. Only one tensor is held in memory, so 8B-parameter files can be written.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                              DType dtype, const std::function<void(size_t, float*)>& fill);

// Half-precision conversions.

}  // namespace specula
