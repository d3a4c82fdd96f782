// Minimal --flag value parsing for the subcommands.
#pragma once

#include <map>
#include <set>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specula {

struct Flags {
  std::map<std::string, std::string> values;
  std::set<std::string> switches;
};

// Parses --name value / --name=value pairs. Flags in `switches` take no value.
inline absl::StatusOr<Flags> ParseFlags(int argc, char** argv, const std::set<std::string>& known,
                                 const std::set<std::string>& switches) {
  Flags f;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_eq = eq != std::string::npos;
    if (has_eq) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switches.count(name)) {
      f.switches.insert(name);
      continue;
    }
    if (!known.count(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!has_eq) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      value = argv[++i];
    }
    f.values[name] = value;
  }
  return f;
}

template <typename T>
inline absl::Status GetNumber(const Flags& f, const std::string& name, T* out) {
  auto it = f.values.find(name);
  if (it == f.values.end()) return absl::OkStatus();
  bool ok;
  if constexpr (std::is_same_v<T, double>) {
    ok = absl::SimpleAtod(it->second, out);
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtof(it->second, out);
  } else {
    ok = absl::SimpleAtoi(it->second, out);
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", it->second, "' is not a number"));
  return absl::OkStatus();
}

}  // namespace specula
