// KvStore over Redis through hiredis 0.14's synchronous API: the one file that sees hiredis.
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"
#include "kvstore/kv_store.h"

namespace specula {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr auto kReconnectInterval = std::chrono::seconds(1);

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// hiredis writes with write(2): a store that went away would raise SIGPIPE, whose default ends the
// process. The signal is blocked in this thread for the call (the write fails with EPIPE instead)
// and one raised meanwhile is consumed, unless it was pending before.
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedNoSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

timeval ToTimeval(double ms) {
  auto us = static_cast<int64_t>(std::llround(ms * 1000));
  return timeval{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
}

// hiredis reports a socket timeout as an I/O error whose errno is EAGAIN (SO_RCVTIMEO, SO_SNDTIMEO)
// or ETIMEDOUT (the connect's poll); errstr is strerror of it, checked too in case errno moved.
bool IsTimeout(const redisContext& c, int saved_errno) {
  if (c.err != REDIS_ERR_IO) return false;
  if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT) return true;
  return std::strcmp(c.errstr, std::strerror(EAGAIN)) == 0 || std::strcmp(c.errstr, std::strerror(ETIMEDOUT)) == 0;
}

class RedisStore final : public KvStore {
 public:
  explicit RedisStore(const KvStoreOptions& o)
      : options_(o), url_(o.url.Redacted()), timeout_(ToTimeval(o.timeout_ms)) {}
  ~RedisStore() override { Drop(); }

  absl::Status Open();
  absl::StatusOr<std::vector<std::optional<std::string>>> Get(absl::Span<const std::string> keys) override {
    bool was_used = used_;
    auto values = GetOnce(keys);
    if (!values.ok() && RetryOnNewConnection(values.status(), was_used)) values = GetOnce(keys);
    return values;
  }
  absl::Status Set(absl::Span<const std::pair<std::string, std::string>> items, int64_t ttl_s) override {
    bool was_used = used_;
    absl::Status s = SetOnce(items, ttl_s);
    if (!s.ok() && RetryOnNewConnection(s, was_used)) s = SetOnce(items, ttl_s);
    return s;
  }

 private:
  // OK with a live context, else a reconnect (at most once per second) or a fast UnavailableError.
  absl::Status Ready();
  // The context's error after `what` failed, as a status; the context is dropped.
  absl::Status Fail(absl::string_view what, int saved_errno);
  absl::Status Handshake(std::vector<std::string> argv);
  absl::Status Remember(absl::Status s) {
    last_error_ = s;
    return s;
  }
  void Drop() {
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
    used_ = false;
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> GetOnce(absl::Span<const std::string> keys);
  absl::Status SetOnce(absl::Span<const std::pair<std::string, std::string>> items, int64_t ttl_s);
  // A connection that has answered before may have been closed while idle (the server's `timeout`, a
  // restart): a failure on it reconnects at once, and the call (MGET or SETs, both idempotent) runs
  // again, once.
  bool RetryOnNewConnection(const absl::Status& s, bool was_used) {
    return was_used && absl::IsUnavailable(s) && context_ == nullptr && Open().ok();
  }

  const KvStoreOptions options_;
  const std::string url_;  // redacted, for errors
  const timeval timeout_;
  redisContext* context_ = nullptr;  // null: not connected
  bool used_ = false;                // the connection has answered a Get or Set
  std::optional<SteadyClock::time_point> last_attempt_;  // the last connect; none before the first
  absl::Status last_error_;
};

absl::Status RedisStore::Fail(absl::string_view what, int saved_errno) {
  std::string message = absl::StrCat("--kv-store: ", url_, ": ", what, ": ", context_->errstr);
  absl::Status s = IsTimeout(*context_, saved_errno)
                       ? absl::DeadlineExceededError(absl::StrCat(message, " (timeout ", options_.timeout_ms, " ms)"))
                       : absl::UnavailableError(message);
  Drop();
  return Remember(s);
}

absl::Status RedisStore::Handshake(std::vector<std::string> argv) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  errno = 0;
  void* raw = nullptr;
  if (redisAppendCommandArgv(context_, args.size(), args.data(), lens.data()) != REDIS_OK ||
      redisGetReply(context_, &raw) != REDIS_OK) {
    return Fail(argv[0], errno);
  }
  ReplyPtr reply(static_cast<redisReply*>(raw));
  if (reply->type != REDIS_REPLY_ERROR) return absl::OkStatus();
  std::string message = absl::StrCat("--kv-store: ", url_, ": ", argv[0], ": ", reply->str);
  bool auth = argv[0] == "AUTH" || std::strncmp(reply->str, "NOAUTH", 6) == 0;
  Drop();
  return Remember(auth ? absl::PermissionDeniedError(message) : absl::FailedPreconditionError(message));
}

absl::Status RedisStore::Open() {
  last_attempt_ = SteadyClock::now();
  ScopedNoSigpipe no_sigpipe;
  errno = 0;
  const KvStoreUrl& u = options_.url;
  context_ = u.path.empty() ? redisConnectWithTimeout(u.host.c_str(), u.port, timeout_)
                            : redisConnectUnixWithTimeout(u.path.c_str(), timeout_);
  int saved_errno = errno;
  if (context_ == nullptr) {
    return Remember(absl::ResourceExhaustedError(absl::StrCat("--kv-store: ", url_, ": no memory for a context")));
  }
  if (context_->err != 0) return Fail("connect", saved_errno);
  if (redisSetTimeout(context_, timeout_) != REDIS_OK) return Fail("setting the timeout", errno);
  if (!u.password.empty()) RETURN_IF_ERROR(Handshake({"AUTH", u.password}));
  if (u.db != 0) RETURN_IF_ERROR(Handshake({"SELECT", absl::StrCat(u.db)}));
  RETURN_IF_ERROR(Handshake({"PING"}));
  last_error_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status RedisStore::Ready() {
  if (context_ != nullptr) return absl::OkStatus();
  if (last_attempt_.has_value() && SteadyClock::now() - *last_attempt_ < kReconnectInterval) {
    return absl::UnavailableError(absl::StrCat(last_error_.message(), " (down; reconnecting at most once a second)"));
  }
  return Open();
}

absl::StatusOr<std::vector<std::optional<std::string>>> RedisStore::GetOnce(absl::Span<const std::string> keys) {
  std::vector<std::optional<std::string>> values;  // [keys]
  RETURN_IF_ERROR(Ready());
  if (keys.empty()) return values;
  std::vector<const char*> args = {"MGET"};  // [1 + keys]
  std::vector<size_t> lens = {4};            // [1 + keys]
  for (const std::string& k : keys) {
    args.push_back(k.data());
    lens.push_back(k.size());
  }
  ScopedNoSigpipe no_sigpipe;
  errno = 0;
  void* raw = nullptr;
  if (redisAppendCommandArgv(context_, args.size(), args.data(), lens.data()) != REDIS_OK ||
      redisGetReply(context_, &raw) != REDIS_OK) {
    return Fail("MGET", errno);
  }
  ReplyPtr reply(static_cast<redisReply*>(raw));
  used_ = true;
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::UnavailableError(absl::StrCat("--kv-store: ", url_, ": MGET: ", reply->str));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != keys.size()) {
    Drop();
    return Remember(absl::UnavailableError(absl::StrCat("--kv-store: ", url_, ": MGET: an unexpected reply")));
  }
  values.reserve(keys.size());
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e->type == REDIS_REPLY_STRING) {
      values.emplace_back(std::string(e->str, e->len));
    } else {
      values.emplace_back(std::nullopt);
    }
  }
  return values;
}

absl::Status RedisStore::SetOnce(absl::Span<const std::pair<std::string, std::string>> items, int64_t ttl_s) {
  if (ttl_s <= 0) return absl::InvalidArgumentError(absl::StrCat("--kv-store: a TTL of ", ttl_s, " s; it must be > 0"));
  if (items.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Ready());
  std::string ttl = absl::StrCat(ttl_s);
  ScopedNoSigpipe no_sigpipe;
  for (const auto& [key, value] : items) {
    const char* args[5] = {"SET", key.data(), value.data(), "EX", ttl.c_str()};
    size_t lens[5] = {3, key.size(), value.size(), 2, ttl.size()};
    if (redisAppendCommandArgv(context_, 5, args, lens) != REDIS_OK) return Fail("SET", errno);
  }
  // Every reply is read, so that the connection stays in step after an error reply.
  absl::Status first_error;
  for (size_t i = 0; i < items.size(); ++i) {
    errno = 0;
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK) return Fail("SET", errno);
    ReplyPtr reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_ERROR && first_error.ok()) {
      first_error = absl::UnavailableError(absl::StrCat("--kv-store: ", url_, ": SET: ", reply->str));
    }
  }
  used_ = true;
  return first_error;
}

absl::Status CheckOptions(const KvStoreOptions& o) {
  if (o.timeout_ms > 0 && o.ttl_s > 0 && o.max_pending_bytes >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--kv-store: timeout_ms (", o.timeout_ms, ") and ttl_s (", o.ttl_s,
                                                 ") must be > 0, max_pending_bytes (", o.max_pending_bytes, ") >= 0"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Connect(const KvStoreOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  auto store = std::make_unique<RedisStore>(o);
  RETURN_IF_ERROR(store->Open());
  return store;
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::ConnectLazily(const KvStoreOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  return std::make_unique<RedisStore>(o);
}

}  // namespace specula
