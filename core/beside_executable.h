// The path of `file` in the running executable's folder (from /proc/self/exe), or "" when that
// cannot be read: where the on-demand modules (libspecula_cuda.so, libspecula_nccl.so,
// libspecula_cli.so) sit in a build or an installed tree.
#pragma once

#include <unistd.h>

#include <climits>
#include <string>
#include <string_view>

namespace specula {

inline std::string BesideExecutable(std::string_view file) {
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  const std::string self(exe, n);
  return self.substr(0, self.find_last_of('/') + 1).append(file);
}

}  // namespace specula
