// Read-only memory mapping of a file, so weights are paged in lazily and never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace specula {

class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Gives the pages inside [p, p + bytes) back to the kernel, when the range is in this file: they
  // leave the process's resident memory (a later read would fault them in again from the page
  // cache). For weights a backend has copied into a format of its own. False if not in the file.
  bool Release(const void* p, size_t bytes) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) text file, e.g. config.json.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// Whether `path` names a directory (an HF model directory, as opposed to a model file).
bool IsDirectory(const std::string& path);

}  // namespace specula
