#include "kvstore/store_url.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"

namespace specula {
namespace {

constexpr absl::string_view kForms = "redis://[:PASSWORD@]HOST[:PORT][/DB] or unix:///PATH[?db=N]";

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("--kv-store: ", what)); }

// Decimal digits only, at most 9 (so no overflow), within [lo, hi].
bool ParseBoundedInt(absl::string_view s, int lo, int hi, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// %XX escapes, so that a password may hold '@', ':', '/', '?' or '&'. The text is never echoed.
absl::StatusOr<std::string> DecodePassword(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    int hi = i + 2 < s.size() ? HexDigit(s[i + 1]) : -1;
    int lo = i + 2 < s.size() ? HexDigit(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) return Bad("the password has a '%' that is not followed by two hex digits");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

absl::StatusOr<int> ParseDb(absl::string_view s) {
  int db = 0;
  if (!ParseBoundedInt(s, 0, 999999999, &db)) {
    return Bad(absl::StrCat("db '", s, "' is not a number >= 0"));
  }
  return db;
}

// HOST[:PORT] or [IPV6][:PORT].
absl::Status ParseHostPort(absl::string_view s, KvStoreUrl* url) {
  absl::string_view port;
  bool has_port = false;
  if (absl::StartsWith(s, "[")) {
    size_t close = s.find(']');
    if (close == absl::string_view::npos) return Bad("an IPv6 address lacks its closing ']'");
    url->host = std::string(s.substr(1, close - 1));
    absl::string_view rest = s.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return Bad("text after an IPv6 address's ']' that is not :PORT");
    has_port = !rest.empty();
    if (has_port) port = rest.substr(1);
  } else {
    size_t colon = s.find(':');
    if (colon != absl::string_view::npos && s.find(':', colon + 1) != absl::string_view::npos) {
      return Bad("an IPv6 host goes in brackets: redis://[::1]:6379");
    }
    url->host = std::string(s.substr(0, colon));
    has_port = colon != absl::string_view::npos;
    if (has_port) port = s.substr(colon + 1);
  }
  if (url->host.empty()) return Bad(absl::StrCat("no host: ", kForms));
  if (has_port && !ParseBoundedInt(port, 1, 65535, &url->port)) {
    return Bad(absl::StrCat("port '", port, "' is not a port (1 to 65535)"));
  }
  return absl::OkStatus();
}

// The part after "redis://".
absl::StatusOr<KvStoreUrl> ParseTcp(absl::string_view rest) {
  KvStoreUrl url;
  size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view db_text = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  size_t at = authority.rfind('@');
  if (at != absl::string_view::npos) {
    absl::string_view userinfo = authority.substr(0, at);
    if (!absl::StartsWith(userinfo, ":")) {
      return Bad("a user name is not supported (one password: redis://:PASSWORD@HOST)");
    }
    ASSIGN_OR_RETURN(url.password, DecodePassword(userinfo.substr(1)));
    authority = authority.substr(at + 1);
  }
  if (authority.find('?') != absl::string_view::npos || db_text.find('?') != absl::string_view::npos) {
    return Bad(absl::StrCat("redis:// takes no query; the db goes in the path: ", kForms));
  }
  RETURN_IF_ERROR(ParseHostPort(authority, &url));
  if (!db_text.empty()) {
    ASSIGN_OR_RETURN(url.db, ParseDb(db_text));
  }
  return url;
}

// The part after "unix://": /PATH[?db=N][&password=PASSWORD].
absl::StatusOr<KvStoreUrl> ParseUnix(absl::string_view rest) {
  KvStoreUrl url;
  size_t q = rest.find('?');
  url.path = std::string(rest.substr(0, q));
  if (url.path.size() < 2 || url.path[0] != '/') {
    return Bad("unix:// takes an absolute socket path: unix:///PATH");
  }
  if (q == absl::string_view::npos) return url;
  for (absl::string_view param : absl::StrSplit(rest.substr(q + 1), '&')) {
    size_t eq = param.find('=');
    absl::string_view key = param.substr(0, eq);
    absl::string_view value = eq == absl::string_view::npos ? "" : param.substr(eq + 1);
    if (key == "db") {
      ASSIGN_OR_RETURN(url.db, ParseDb(value));
    } else if (key == "password") {
      ASSIGN_OR_RETURN(url.password, DecodePassword(value));
    } else {
      return Bad(absl::StrCat("unknown parameter '", key, "' in a unix:// URL (db, password)"));
    }
  }
  return url;
}

}  // namespace

std::string KvStoreUrl::Redacted() const {
  if (!path.empty()) {
    std::vector<std::string> params;
    if (db != 0) params.push_back(absl::StrCat("db=", db));
    if (!password.empty()) params.push_back("password=***");
    return absl::StrCat("unix://", path, params.empty() ? "" : "?", absl::StrJoin(params, "&"));
  }
  std::string shown_host = host.find(':') == std::string::npos ? host : absl::StrCat("[", host, "]");
  return absl::StrCat("redis://", password.empty() ? "" : ":***@", shown_host, ":", port,
                      db == 0 ? "" : absl::StrCat("/", db));
}

absl::StatusOr<KvStoreUrl> ParseKvStoreUrl(std::string_view url_text) {
  absl::string_view url(url_text.data(), url_text.size());
  size_t sep = url.find("://");
  if (sep == absl::string_view::npos) return Bad(absl::StrCat("not a URL: ", kForms));
  std::string scheme = absl::AsciiStrToLower(url.substr(0, sep));
  absl::string_view rest = url.substr(sep + 3);
  if (scheme == "redis") return ParseTcp(rest);
  if (scheme == "unix") return ParseUnix(rest);
  if (scheme == "rediss") {
    return Bad("rediss:// (TLS) is not supported: Debian's hiredis 0.14 has no TLS");
  }
  return Bad(absl::StrCat("scheme '", scheme, "' is not supported: ", kForms));
}

}  // namespace specula
