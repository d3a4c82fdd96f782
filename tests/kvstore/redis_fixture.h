// A real redis-server for tests: its own process on a unix socket in a fresh temporary directory
// (no TCP port, no persistence, 64 MB with LRU eviction), never the system's service. The kvstore,
// engine and serving tests share it; it needs nothing but POSIX and Abseil.
//
//   if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kSkipReason;
//   RedisServer redis;
//   ASSERT_TRUE(redis.Start().ok());
//   ... ParseKvStoreUrl(redis.url()) ...
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace specula::testing {

class RedisServer {
 public:
  static constexpr const char* kSkipReason =
      "redis-server is not on PATH (scripts/install_deps.sh installs the redis-server package)";

  static bool Available() {
    const char* path = std::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
      std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/redis-server");
      if (::access(candidate.c_str(), X_OK) == 0) return true;
    }
    return false;
  }

  // `extra_args` follow the fixed ones, e.g. {"--requirepass", "secret"}.
  explicit RedisServer(std::vector<std::string> extra_args = {}) : extra_args_(std::move(extra_args)) {
    std::string tmpl = "/tmp/specula_redis_XXXXXX";  // short: a socket path has at most 107 bytes
    if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  }
  ~RedisServer() {
    Kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  std::string socket_path() const { return dir_ + "/redis.sock"; }
  std::string url() const { return "unix://" + socket_path(); }

  // Starts the server and waits (at most 5 s) until it answers.
  absl::Status Start() {
    if (dir_.empty()) return absl::InternalError("no temporary directory for redis-server");
    Kill();
    std::vector<std::string> args = {"redis-server", "--port", "0", "--unixsocket", socket_path(),
                                     "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                                     "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru",
                                     "--dir", dir_, "--logfile", log_path(), "--daemonize", "no"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (int rc = ::posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(), environ); rc != 0) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("posix_spawnp redis-server: ", std::strerror(rc)));
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Answers()) return absl::OkStatus();
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat("redis-server exited at start; its log:\n", Log()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return absl::DeadlineExceededError(absl::StrCat("redis-server did not answer within 5 s; its log:\n", Log()));
  }

  // SIGKILL, as a crash: connections drop, the socket file stays, the data is gone.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  absl::Status Restart() {
    Kill();
    return Start();
  }
  // SIGSTOP: the kernel still accepts connections and buffers commands, but nothing answers.
  void Pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void Resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

 private:
  std::string log_path() const { return dir_ + "/redis.log"; }
  std::string Log() const {
    std::ifstream in(log_path());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // One PING on a fresh connection; any reply (+PONG, or -NOAUTH under --requirepass) within 200 ms.
  bool Answers() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string path = socket_path();
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6) {
      pollfd p{fd, POLLIN, 0};
      char c = 0;
      ok = ::poll(&p, 1, 200) == 1 && ::recv(fd, &c, 1, 0) == 1 && (c == '+' || c == '-');
    }
    ::close(fd);
    return ok;
  }

  std::vector<std::string> extra_args_;
  std::string dir_;  // the temporary directory: socket, log
  pid_t pid_ = -1;
};

}  // namespace specula::testing
