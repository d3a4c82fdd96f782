#include "model/safetensors.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace specula {

using json = nlohmann::json;

absl::StatusOr<DType> ParseSafetensorsDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype '", name, "' (supported: F32, F16, BF16)"));
}

const char* SafetensorsDTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}


int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  SafetensorsFile f;
  f.file_ = std::move(mapped).value();
  const uint8_t* base = f.file_.data();
  const uint64_t size = f.file_.size();
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt safetensors file: ", why));
  };
  if (size < 8) return corrupt(absl::StrCat("only ", size, " bytes, no header"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > size - 8) {
    return corrupt(absl::StrCat("header length ", header_len, " exceeds file size ", size));
  }
  json header = json::parse(base + 8, base + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return corrupt("header is not a JSON object");
  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto& item : header.items()) {
    const std::string& name = item.key();  // not a structured binding: clang 14 cannot capture one
    json& e = item.value();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': ", why));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      return bad("entry needs dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string()) return bad("dtype must be a string");
    auto dtype = ParseSafetensorsDType(e["dtype"].get<std::string>());
    if (!dtype.ok()) return bad(std::string(dtype.status().message()));
    TensorEntry t;
    t.dtype = *dtype;
    int64_t numel = 1;
    if (!e["shape"].is_array()) return bad("shape must be a list");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("shape has a bad dimension");
      t.shape.push_back(d.get<int64_t>());
      if (t.shape.back() > 0 && numel > (int64_t{1} << 40) / t.shape.back()) {
        return bad("shape is too large");
      }
      numel *= t.shape.back();
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] lie outside the data section (",
                              data_size, " bytes)"));
    }
    if (end - begin != static_cast<uint64_t>(numel) * DTypeBytes(t.dtype)) {
      return bad(absl::StrCat("data_offsets span ", end - begin, " bytes but shape [",
                              absl::StrJoin(t.shape, ", "), "] of ", SafetensorsDTypeName(t.dtype), " needs ",
                              numel * DTypeBytes(t.dtype)));
    }
    t.data = data + begin;
    t.num_bytes = static_cast<int64_t>(end - begin);
    f.tensors_.emplace(name, std::move(t));
  }
  return f;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                              DType dtype, const std::function<void(size_t, float*)>& fill) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& s : specs) {
    const uint64_t bytes = static_cast<uint64_t>(s.NumElements()) * DTypeBytes(dtype);
    header[s.name] = {{"dtype", SafetensorsDTypeName(dtype)}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps tensor data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open for writing"));
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::vector<float> buf;         // [numel] of the current tensor
  std::vector<uint16_t> half;     // [numel] when dtype is 16-bit
  for (size_t i = 0; i < specs.size(); ++i) {
    buf.assign(specs[i].NumElements(), 0.0f);
    fill(i, buf.data());
    if (dtype == DType::kF32) {
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 4));
    } else {
      half.resize(buf.size());
      for (size_t j = 0; j < buf.size(); ++j) {
        half[j] = dtype == DType::kBF16 ? F32ToBf16(buf[j]) : F32ToF16(buf[j]);
      }
      out.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(half.size() * 2));
    }
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed (disk full?)"));
  return absl::OkStatus();
}

}  // namespace specula
