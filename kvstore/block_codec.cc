#include "kvstore/block_codec.h"

#include <xxhash.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specula {
namespace {

constexpr char kMagic[4] = {'S', 'P', 'K', 'V'};
constexpr uint16_t kVersion = 1;

// Explicit byte order, so that a value written on one host reads the same on any other.
void PutLe(uint64_t v, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetLe(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

absl::Status Loss(absl::string_view what) { return absl::DataLossError(absl::StrCat("KV block: ", what)); }

}  // namespace

std::string EncodeBlock(absl::Span<const int32_t> tokens, absl::Span<const absl::string_view> parts) {
  size_t payload_bytes = 0;
  for (absl::string_view part : parts) payload_bytes += part.size();
  std::string out(kBlockHeaderBytes + 4 * tokens.size() + payload_bytes + kBlockChecksumBytes, '\0');
  char* p = out.data();
  for (char c : kMagic) *p++ = c;
  PutLe(kVersion, 2, p);
  PutLe(0, 2, p + 2);
  PutLe(tokens.size(), 4, p + 4);
  PutLe(payload_bytes, 8, p + 8);
  p += 16;
  for (int32_t t : tokens) {
    PutLe(static_cast<uint32_t>(t), 4, p);
    p += 4;
  }
  for (absl::string_view part : parts) {
    if (!part.empty()) std::memcpy(p, part.data(), part.size());
    p += part.size();
  }
  PutLe(XXH3_64bits(out.data(), p - out.data()), 8, p);
  return out;
}

absl::StatusOr<absl::string_view> DecodeBlock(absl::string_view value, absl::Span<const int32_t> expect_tokens,
                                              size_t expect_payload_bytes) {
  if (value.size() < kBlockHeaderBytes + kBlockChecksumBytes) {
    return Loss(absl::StrCat("truncated: ", value.size(), " bytes, less than a header and checksum"));
  }
  const char* p = value.data();
  if (absl::string_view(p, 4) != absl::string_view(kMagic, 4)) return Loss("bad magic (not an SPKV value)");
  uint64_t version = GetLe(p + 4, 2);
  if (version != kVersion || GetLe(p + 6, 2) != 0) {
    return Loss(absl::StrCat("version ", version, " (this build reads version ", kVersion, ")"));
  }
  uint64_t num_tokens = GetLe(p + 8, 4);
  uint64_t payload_bytes = GetLe(p + 12, 8);
  uint64_t body = value.size() - kBlockHeaderBytes - kBlockChecksumBytes;  // tokens and payload
  if (payload_bytes > body || 4 * num_tokens != body - payload_bytes) {
    return Loss(absl::StrCat("size: ", value.size(), " bytes, but the header says ", num_tokens, " tokens and ",
                             payload_bytes, " payload bytes"));
  }
  size_t checked = value.size() - kBlockChecksumBytes;
  if (XXH3_64bits(p, checked) != GetLe(p + checked, 8)) return Loss("checksum mismatch");
  if (num_tokens != expect_tokens.size()) {
    return Loss(absl::StrCat("holds ", num_tokens, " tokens, expected ", expect_tokens.size()));
  }
  const char* tokens = p + kBlockHeaderBytes;
  for (size_t i = 0; i < num_tokens; ++i) {
    auto t = static_cast<int32_t>(static_cast<uint32_t>(GetLe(tokens + 4 * i, 4)));
    if (t != expect_tokens[i]) {
      return Loss(absl::StrCat("token ", i, " is ", t, ", expected ", expect_tokens[i]));
    }
  }
  if (payload_bytes != expect_payload_bytes) {
    return Loss(absl::StrCat("payload of ", payload_bytes, " bytes, expected ", expect_payload_bytes));
  }
  return value.substr(kBlockHeaderBytes + 4 * num_tokens, payload_bytes);
}

}  // namespace specula
