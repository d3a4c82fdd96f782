// One stored value of the shared KV block store: a full KV block with the tokens it holds, so that
// a value read back under a key (a prefix hash) is checked against the tokens the reader expects
// before its bytes go into the KV pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace specula {

inline constexpr size_t kBlockHeaderBytes = 20;   // magic, version, reserved, num_tokens, payload_bytes
inline constexpr size_t kBlockChecksumBytes = 8;  // XXH3-64

// [magic "SPKV" 4][version u16 = 1][u16 0][num_tokens u32][payload_bytes u64][tokens int32 x n]
// [payload][XXH3-64 of all bytes before it, u64]; little-endian.
// `parts` are concatenated into the payload (a KV block is one piece per layer, K and V).
std::string EncodeBlock(absl::Span<const int32_t> tokens, absl::Span<const absl::string_view> parts);

// The payload, after checking the magic, version, sizes, the checksum, that the tokens equal
// `expect_tokens`, and that the payload has `expect_payload_bytes`. DataLossError naming what failed.
// The view points into `value`.
absl::StatusOr<absl::string_view> DecodeBlock(absl::string_view value, absl::Span<const int32_t> expect_tokens,
                                              size_t expect_payload_bytes);

}  // namespace specula
