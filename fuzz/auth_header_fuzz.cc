// The API key check of both front ends (serving/security.cc BearerMatches: the HTTP
// `Authorization` header and gRPC's `authorization` metadata), against a plain comparison that
// says what it must decide: the key is set, and the value is "Bearer " (the scheme in any case)
// followed by exactly the key. The input is `KEY\nVALUE`; without a newline it is the key, and the
// value is "Bearer KEY" (the matching case, which random inputs seldom reach).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "serving/security.h"

namespace {

bool Reference(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "bearer ";
  if (key.empty() || authorization.size() < kScheme.size()) return false;
  std::string scheme(authorization.substr(0, kScheme.size()));
  for (char& c : scheme) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return scheme == kScheme && authorization.substr(kScheme.size()) == key;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string_view key = input.substr(0, newline);
  const std::string authorization =
      newline == std::string_view::npos ? "Bearer " + std::string(key) : std::string(input.substr(newline + 1));
  if (specula::BearerMatches(authorization, key) != Reference(authorization, key)) __builtin_trap();
  return 0;
}
