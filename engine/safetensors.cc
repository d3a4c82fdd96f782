#include "engine/safetensors.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace specula {

using json = nlohmann::json;

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype '", name, "' (supported: F32, F16, BF16)"));
}

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

int DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }

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
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': ", why));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      return bad("entry needs dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string()) return bad("dtype must be a string");
    auto dtype = ParseDType(e["dtype"].get<std::string>());
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
    if (end - begin != static_cast<uint64_t>(numel) * DTypeSize(t.dtype)) {
      return bad(absl::StrCat("data_offsets span ", end - begin, " bytes but shape [",
                              absl::StrJoin(t.shape, ", "), "] of ", DTypeName(t.dtype), " needs ",
                              numel * DTypeSize(t.dtype)));
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
    const uint64_t bytes = static_cast<uint64_t>(s.NumElements()) * DTypeSize(dtype);
    header[s.name] = {{"dtype", DTypeName(dtype)}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
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

float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = bits & 0x7fffffu;
  if (((bits >> 23) & 0xffu) == 0xffu) return sign | 0x7c00u | (mant ? 0x200u : 0u);
  if (exp >= 0x1f) return sign | 0x7c00u;  // overflow to inf
  if (exp <= 0) {
    if (exp < -10) return sign;
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return sign | static_cast<uint16_t>(half_mant);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return sign | static_cast<uint16_t>(h);
}

}  // namespace specula
