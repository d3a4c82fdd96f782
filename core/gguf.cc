#include "core/gguf.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace specula {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

// A cursor over the mapped bytes: every read checks what is left, and an error names the field
// being read and its offset.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& path) : p_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": GGUF ", field, " at byte ", pos_, ": ", what));
  }

  template <typename T>
  absl::StatusOr<T> Read(const std::string& field) {
    if (left() < sizeof(T)) {
      return Error(field, absl::StrCat("needs ", sizeof(T), " bytes, the file has ", left(), " left (truncated?)"));
    }
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string_view> ReadString(const std::string& field) {
    ASSIGN_OR_RETURN(const uint64_t len, Read<uint64_t>(field + " length"));
    if (len > left()) {
      pos_ -= 8;
      return Error(field, absl::StrCat("string length ", len, " exceeds the ", left() - 8, " bytes left"));
    }
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status Skip(uint64_t bytes, const std::string& field) {
    if (bytes > left()) return Error(field, absl::StrCat("needs ", bytes, " bytes, the file has ", left(), " left"));
    pos_ += bytes;
    return absl::OkStatus();
  }

  const uint8_t* here() const { return p_ + pos_; }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

// Bytes of one scalar of `t`; 0 for strings and arrays.
size_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool: return 1;
    case GgufType::kU16:
    case GgufType::kI16: return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32: return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64: return 8;
    default: return 0;
  }
}

bool IsValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Widens the scalar at `p` into v.i / v.u / v.f.
void DecodeScalar(GgufType t, const uint8_t* p, GgufValue* v) {
  auto load = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case GgufType::kU8: v->u = load(uint8_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kBool: v->u = load(uint8_t{}) != 0; v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI8: v->i = load(int8_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kU16: v->u = load(uint16_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI16: v->i = load(int16_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kU32: v->u = load(uint32_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI32: v->i = load(int32_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kU64: v->u = load(uint64_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI64: v->i = load(int64_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kF32: v->f = load(float{}); break;
    case GgufType::kF64: v->f = load(double{}); break;
    default: break;
  }
  if (t != GgufType::kF32 && t != GgufType::kF64) v->f = static_cast<double>(v->i);
}

absl::StatusOr<GgufValue> ReadValue(Reader& r, const std::string& key) {
  GgufValue v;
  ASSIGN_OR_RETURN(const uint32_t type, r.Read<uint32_t>(key + " type"));
  if (!IsValidType(type)) return r.Error(key, absl::StrCat("unknown value type ", type));
  v.type = static_cast<GgufType>(type);
  if (v.type == GgufType::kString) {
    ASSIGN_OR_RETURN(v.str, r.ReadString(key));
    return v;
  }
  if (v.type != GgufType::kArray) {
    const uint8_t* p = r.here();
    RETURN_IF_ERROR(r.Skip(ScalarBytes(v.type), key));
    DecodeScalar(v.type, p, &v);
    return v;
  }
  ASSIGN_OR_RETURN(const uint32_t elem, r.Read<uint32_t>(key + " array type"));
  if (!IsValidType(elem) || static_cast<GgufType>(elem) == GgufType::kArray) {
    return r.Error(key, absl::StrCat("array element type ", elem, " is not supported"));
  }
  v.elem_type = static_cast<GgufType>(elem);
  ASSIGN_OR_RETURN(v.count, r.Read<uint64_t>(key + " array length"));
  if (v.elem_type == GgufType::kString) {
    // Each string takes at least its 8-byte length: bound the count before reserving.
    if (v.count > r.left() / 8) {
      return r.Error(key, absl::StrCat("array length ", v.count, " exceeds what the ", r.left(), " bytes left hold"));
    }
    v.strs.reserve(v.count);
    for (uint64_t i = 0; i < v.count; ++i) {
      ASSIGN_OR_RETURN(std::string_view s, r.ReadString(absl::StrCat(key, "[", i, "]")));
      v.strs.push_back(s);
    }
    return v;
  }
  const size_t es = ScalarBytes(v.elem_type);
  if (v.count > r.left() / es) {
    return r.Error(key, absl::StrCat("array length ", v.count, " exceeds what the ", r.left(), " bytes left hold"));
  }
  v.data = r.here();
  RETURN_IF_ERROR(r.Skip(v.count * es, key));
  return v;
}

// The fixed header's fields past its magic.
struct Header {
  uint32_t version;
  uint64_t n_tensors;
  uint64_t n_kv;
};

absl::StatusOr<Header> ReadHeader(Reader& r, const std::string& path) {
  ASSIGN_OR_RETURN(const uint32_t magic, r.Read<uint32_t>("magic"));
  if (magic != kMagic) return absl::InvalidArgumentError(absl::StrCat(path, ": not a GGUF file (bad magic)"));
  Header h;
  ASSIGN_OR_RETURN(h.version, r.Read<uint32_t>("version"));
  if (h.version != 2 && h.version != 3) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF version ", h.version, " is not supported (2 or 3)"));
  }
  ASSIGN_OR_RETURN(h.n_tensors, r.Read<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(h.n_kv, r.Read<uint64_t>("metadata count"));
  return h;
}

absl::Status ReadMetadata(Reader& r, uint64_t n_kv, std::map<std::string, GgufValue, std::less<>>* kv) {
  // A key/value takes at least 12 bytes: bound the count by the file.
  if (n_kv > r.left() / 12) return r.Error("metadata count", absl::StrCat(n_kv, " entries cannot fit in the file"));
  for (uint64_t i = 0; i < n_kv; ++i) {
    ASSIGN_OR_RETURN(std::string_view key, r.ReadString(absl::StrCat("metadata key #", i)));
    ASSIGN_OR_RETURN(GgufValue v, ReadValue(r, std::string(key)));
    if (!kv->emplace(std::string(key), std::move(v)).second) {
      return r.Error(std::string(key), "duplicate metadata key");
    }
  }
  return absl::OkStatus();
}

// The alignment of the data section and of every tensor offset: general.alignment, else 32.
absl::StatusOr<uint64_t> DataAlignment(const GgufValue* a, const std::string& path) {
  if (a == nullptr) return kDefaultAlignment;
  if (a->type != GgufType::kU32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF general.alignment must be a power of two (u32), got ", a->u));
  }
  return a->u;
}

// The tensor directory: each tensor's name, dimensions, type and size, and its offset into the data
// section (offsets: [n_tensors]); the data pointers are set once the section's start is known.
absl::Status ReadTensorInfos(Reader& r, uint64_t n_tensors, uint64_t alignment, std::vector<GgufTensor>* tensors,
                             std::vector<uint64_t>* offsets) {
  // A tensor entry takes at least 28 bytes: bound the count by the file.
  if (n_tensors > r.left() / 28) return r.Error("tensor count", absl::StrCat(n_tensors, " tensors cannot fit in the file"));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    ASSIGN_OR_RETURN(std::string_view name, r.ReadString(absl::StrCat("tensor #", i, " name")));
    t.name = std::string(name);
    const std::string field = absl::StrCat("tensor '", t.name, "'");
    ASSIGN_OR_RETURN(const uint32_t n_dims, r.Read<uint32_t>(field + " dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) return r.Error(field, absl::StrCat("dimension count ", n_dims, " (1 to 4)"));
    int64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(const uint64_t dim, r.Read<uint64_t>(absl::StrCat(field, " dim ", d)));
      if (dim == 0 || dim > (1ull << 40) || static_cast<uint64_t>(elems) > (1ull << 42) / dim) {
        return r.Error(field, absl::StrCat("dim ", d, " = ", dim, " is out of range"));
      }
      elems *= static_cast<int64_t>(dim);
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    ASSIGN_OR_RETURN(const uint32_t type, r.Read<uint32_t>(field + " type"));
    if (!IsSupportedQuantType(type)) {
      return r.Error(field, absl::StrCat("tensor type ", type, " is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)"));
    }
    t.type = static_cast<QuantType>(type);
    if (t.dims[0] % QuantBlockSize(t.type) != 0) {
      return r.Error(field, absl::StrCat("row length ", t.dims[0], " is not a multiple of ", QuantTypeName(t.type),
                                         "'s block of ", QuantBlockSize(t.type)));
    }
    t.bytes = elems / QuantBlockSize(t.type) * QuantBlockBytes(t.type);
    ASSIGN_OR_RETURN(const uint64_t offset, r.Read<uint64_t>(field + " offset"));
    if (offset % alignment != 0) return r.Error(field, absl::StrCat("offset ", offset, " is not aligned to ", alignment));
    offsets->push_back(offset);
    tensors->push_back(std::move(t));
  }
  return absl::OkStatus();
}

// Points each tensor at its data, data_start + its offset into the mapping, once its bytes are
// known to lie inside the file.
absl::Status PlaceTensorData(const MappedFile& file, uint64_t data_start, const std::vector<uint64_t>& offsets,
                             const std::string& path, std::vector<GgufTensor>* tensors) {
  const uint64_t size = file.size();
  for (size_t i = 0; i < tensors->size(); ++i) {
    GgufTensor& t = (*tensors)[i];
    const uint64_t off = offsets[i];
    if (data_start > size || off > size - data_start || static_cast<uint64_t>(t.bytes) > size - data_start - off) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF tensor '", t.name, "' (", t.bytes, " bytes at offset ",
                                                     off, ") runs past the end of the file (", size,
                                                     " bytes; truncated?)"));
    }
    t.data = file.data() + data_start + off;
  }
  return absl::OkStatus();
}

absl::Status CheckUniqueTensorNames(const std::vector<GgufTensor>& tensors, const std::string& path) {
  std::set<std::string_view> names;
  for (const GgufTensor& t : tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF tensor '", t.name, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  GgufFile f;
  ASSIGN_OR_RETURN(f.file_, MappedFile::Open(path));
  Reader r(f.file_.data(), f.file_.size(), path);
  ASSIGN_OR_RETURN(const Header header, ReadHeader(r, path));
  f.version_ = header.version;
  RETURN_IF_ERROR(ReadMetadata(r, header.n_kv, &f.kv_));
  ASSIGN_OR_RETURN(const uint64_t alignment, DataAlignment(f.Find("general.alignment"), path));
  std::vector<uint64_t> offsets;  // [n_tensors] each tensor's data, from the data section's start
  RETURN_IF_ERROR(ReadTensorInfos(r, header.n_tensors, alignment, &f.tensors_, &offsets));
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  RETURN_IF_ERROR(PlaceTensorData(f.file_, data_start, offsets, path, &f.tensors_));
  RETURN_IF_ERROR(CheckUniqueTensorNames(f.tensors_, path));
  return f;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  for (const GgufTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::Status GgufFile::Missing(std::string_view key) const {
  return absl::NotFoundError(absl::StrCat(path(), ": GGUF metadata ", std::string(key), " is missing"));
}

absl::Status GgufFile::NotA(std::string_view key, const char* what) const {
  return absl::InvalidArgumentError(absl::StrCat(path(), ": GGUF metadata ", std::string(key), " ", what));
}

namespace {
bool IsInteger(GgufType t) {
  return t != GgufType::kF32 && t != GgufType::kF64 && t != GgufType::kString && t != GgufType::kArray;
}
}  // namespace

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufType::kString) {
    return NotA(key, "is not a string");
  }
  return v->str;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!IsInteger(v->type)) {
    return NotA(key, "is not an integer");
  }
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type == GgufType::kString || v->type == GgufType::kArray) {
    return NotA(key, "is not a number");
  }
  return v->f;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufType::kArray || !IsInteger(v->elem_type)) {
    return NotA(key, "is not an array of integers");
  }
  std::vector<int64_t> out(v->count);
  const size_t es = ScalarBytes(v->elem_type);
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    DecodeScalar(v->elem_type, v->data + i * es, &e);
    out[i] = e.i;
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufType::kArray || v->elem_type == GgufType::kString) {
    return NotA(key, "is not an array of numbers");
  }
  std::vector<float> out(v->count);
  const size_t es = ScalarBytes(v->elem_type);
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    DecodeScalar(v->elem_type, v->data + i * es, &e);
    out[i] = static_cast<float>(e.f);
  }
  return out;
}

absl::StatusOr<const std::vector<std::string_view>*> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
    return NotA(key, "is not an array of strings");
  }
  return &v->strs;
}

}  // namespace specula
