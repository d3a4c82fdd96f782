// The shared KV block store's client against a real redis-server (tests/kvstore/redis_fixture.h):
// URLs, the block codec, Get/Set with TTLs, and the I/O thread through kills, restarts and pauses.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstore/block_codec.h"
#include "kvstore/kv_store.h"
#include "kvstore/kv_transfer.h"
#include "kvstore/store_url.h"
#include "tests/kvstore/redis_fixture.h"

namespace specula {
namespace {

using testing::RedisServer;

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// URLs

TEST(KvStoreUrlTest, ParsesEachForm) {
  auto plain = ParseKvStoreUrl("redis://localhost");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->host, "localhost");
  EXPECT_EQ(plain->port, 6379);
  EXPECT_EQ(plain->path, "");
  EXPECT_EQ(plain->password, "");
  EXPECT_EQ(plain->db, 0);

  auto full = ParseKvStoreUrl("redis://:p%40ss:w@cache.internal:7000/3");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->host, "cache.internal");
  EXPECT_EQ(full->port, 7000);
  EXPECT_EQ(full->password, "p@ss:w");
  EXPECT_EQ(full->db, 3);

  auto v6 = ParseKvStoreUrl("REDIS://[::1]:6380/");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 6380);
  EXPECT_EQ(v6->db, 0);

  auto unix_plain = ParseKvStoreUrl("unix:///run/redis/redis.sock");
  ASSERT_TRUE(unix_plain.ok()) << unix_plain.status();
  EXPECT_EQ(unix_plain->host, "");
  EXPECT_EQ(unix_plain->path, "/run/redis/redis.sock");
  EXPECT_EQ(unix_plain->db, 0);

  auto unix_db = ParseKvStoreUrl("unix:///tmp/r.sock?db=2&password=a%26b");
  ASSERT_TRUE(unix_db.ok()) << unix_db.status();
  EXPECT_EQ(unix_db->path, "/tmp/r.sock");
  EXPECT_EQ(unix_db->db, 2);
  EXPECT_EQ(unix_db->password, "a&b");
}

void ExpectRefused(std::string_view url, std::string_view says) {
  auto parsed = ParseKvStoreUrl(url);
  ASSERT_FALSE(parsed.ok()) << url;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << url;
  std::string message(parsed.status().message());
  EXPECT_EQ(message.rfind("--kv-store: ", 0), 0u) << message;
  EXPECT_NE(message.find(says), std::string::npos) << url << " -> " << message;
}

TEST(KvStoreUrlTest, RefusesEachBadForm) {
  ExpectRefused("rediss://cache:6380", "rediss:// (TLS) is not supported: Debian's hiredis 0.14 has no TLS");
  ExpectRefused("http://cache:6379", "scheme 'http' is not supported");
  ExpectRefused("cache:6379", "not a URL");
  ExpectRefused("redis://cache:0", "port '0' is not a port");
  ExpectRefused("redis://cache:65536", "port '65536' is not a port");
  ExpectRefused("redis://cache:http", "port 'http' is not a port");
  ExpectRefused("redis://cache:", "port '' is not a port");
  ExpectRefused("redis://cache/x", "db 'x' is not a number");
  ExpectRefused("redis://cache/-1", "db '-1' is not a number");
  ExpectRefused("redis://cache?db=1", "takes no query");
  ExpectRefused("redis://", "no host");
  ExpectRefused("redis://:pw@", "no host");
  ExpectRefused("redis://::1:6379", "IPv6 host goes in brackets");
  ExpectRefused("redis://[::1:6379", "closing ']'");
  ExpectRefused("redis://user:pw@cache", "a user name is not supported");
  ExpectRefused("redis://:bad%zzpw@cache", "'%' that is not followed by two hex digits");
  ExpectRefused("unix://relative.sock", "absolute socket path");
  ExpectRefused("unix:///tmp/r.sock?db=two", "db 'two' is not a number");
  ExpectRefused("unix:///tmp/r.sock?timeout=3", "unknown parameter 'timeout'");
}

TEST(KvStoreUrlTest, NeverShowsThePassword) {
  auto tcp = ParseKvStoreUrl("redis://:s3cret@cache:7000/1");
  ASSERT_TRUE(tcp.ok());
  EXPECT_EQ(tcp->Redacted(), "redis://:***@cache:7000/1");
  auto v6 = ParseKvStoreUrl("redis://[::1]");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->Redacted(), "redis://[::1]:6379");
  auto unix_url = ParseKvStoreUrl("unix:///tmp/r.sock?password=s3cret&db=4");
  ASSERT_TRUE(unix_url.ok());
  EXPECT_EQ(unix_url->Redacted(), "unix:///tmp/r.sock?db=4&password=***");
  for (std::string_view bad : {"redis://:s3cret@cache:port", "redis://us3r:s3cret@cache", "redis://:s3cret@cache/x",
                               "unix:///r.sock?password=s3cret&x=1"}) {
    auto parsed = ParseKvStoreUrl(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().message().find("s3cret"), absl::string_view::npos) << parsed.status();
  }
}

// ---------------------------------------------------------------------------------------------
// The block codec

TEST(BlockCodecTest, RoundTripsWithTheDocumentedLayout) {
  std::vector<int32_t> tokens = {1, 70000, -3};
  std::string layer0 = "K0V0";
  std::string layer1("\0\r\n\xff", 4);
  std::string value = EncodeBlock(tokens, {layer0, "", layer1});
  ASSERT_EQ(value.size(), kBlockHeaderBytes + 4 * tokens.size() + 8 + kBlockChecksumBytes);
  EXPECT_EQ(value.substr(0, 4), "SPKV");
  EXPECT_EQ(value.substr(4, 4), std::string("\x01\x00\x00\x00", 4));     // version 1, reserved 0
  EXPECT_EQ(value.substr(8, 4), std::string("\x03\x00\x00\x00", 4));     // 3 tokens
  EXPECT_EQ(value.substr(12, 8), std::string("\x08\0\0\0\0\0\0\0", 8));  // 8 payload bytes
  EXPECT_EQ(value.substr(20, 4), std::string("\x01\x00\x00\x00", 4));    // token 1
  EXPECT_EQ(value.substr(24, 4), std::string("\x70\x11\x01\x00", 4));    // token 70000
  EXPECT_EQ(value.substr(28, 4), std::string("\xfd\xff\xff\xff", 4));    // token -3
  auto payload = DecodeBlock(value, tokens, 8);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, layer0 + layer1);

  std::string empty = EncodeBlock({}, {});
  auto none = DecodeBlock(empty, {}, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

void ExpectLoss(absl::string_view value, absl::Span<const int32_t> tokens, size_t bytes, absl::string_view says) {
  auto decoded = DecodeBlock(value, tokens, bytes);
  ASSERT_FALSE(decoded.ok()) << says;
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << decoded.status();
  EXPECT_NE(decoded.status().message().find(says), absl::string_view::npos) << decoded.status();
}

TEST(BlockCodecTest, EachCorruptionIsDataLoss) {
  std::vector<int32_t> tokens = {5, 6, 7, 8};
  std::string payload(1000, 'x');
  std::string value = EncodeBlock(tokens, {payload});
  ASSERT_TRUE(DecodeBlock(value, tokens, 1000).ok());

  std::string flipped = value;
  flipped[kBlockHeaderBytes + 16 + 500] ^= 0x01;  // a payload byte
  ExpectLoss(flipped, tokens, 1000, "checksum mismatch");
  std::string flipped_token = value;
  flipped_token[kBlockHeaderBytes + 4] ^= 0x01;
  ExpectLoss(flipped_token, tokens, 1000, "checksum mismatch");
  std::string flipped_sum = value;
  flipped_sum.back() ^= 0x01;
  ExpectLoss(flipped_sum, tokens, 1000, "checksum mismatch");

  ExpectLoss(value, std::vector<int32_t>{5, 6, 9, 8}, 1000, "token 2 is 7, expected 9");
  ExpectLoss(value, std::vector<int32_t>{5, 6, 7}, 1000, "holds 4 tokens, expected 3");
  ExpectLoss(value, tokens, 999, "payload of 1000 bytes, expected 999");

  ExpectLoss(value.substr(0, value.size() - 1), tokens, 1000, "size:");
  ExpectLoss(value.substr(0, 10), tokens, 1000, "truncated");
  ExpectLoss(value + "z", tokens, 1000, "size:");
  std::string bad_magic = value;
  bad_magic[0] = 'X';
  ExpectLoss(bad_magic, tokens, 1000, "bad magic");
  std::string bad_version = value;
  bad_version[4] = 2;
  ExpectLoss(bad_version, tokens, 1000, "version 2");
  // A payload size in the header past the value (which an unchecked reader would overrun).
  std::string huge = value;
  huge[19] = '\x7f';
  ExpectLoss(huge, tokens, 1000, "size:");
}

// ---------------------------------------------------------------------------------------------
// A real redis-server

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kSkipReason;
    redis_ = std::make_unique<RedisServer>();
    absl::Status started = redis_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }

  KvStoreOptions Options(double timeout_ms = 200) const {
    KvStoreOptions o;
    auto url = ParseKvStoreUrl(redis_->url());
    EXPECT_TRUE(url.ok()) << url.status();
    if (url.ok()) o.url = *url;
    o.timeout_ms = timeout_ms;
    return o;
  }

  std::unique_ptr<KvStore> Connected() {
    auto store = KvStore::Connect(Options());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // The result of `ticket`, waiting at most `max_s`; a failed result if none came.
  static KvFetchResult Await(KvTransfer& t, uint64_t ticket, double max_s = 5) {
    double deadline = NowS() + max_s;
    while (NowS() < deadline) {
      for (KvFetchResult& r : t.TakeFetched()) {
        if (r.ticket == ticket) return std::move(r);
        ADD_FAILURE() << "an unexpected ticket " << r.ticket;
      }
      t.Wait(50);
    }
    ADD_FAILURE() << "no result for ticket " << ticket << " within " << max_s << " s";
    return KvFetchResult{ticket, {}, absl::DeadlineExceededError("test: no result"), max_s};
  }

  // Waits (at most max_s) until `tag`'s writes are done.
  static bool AwaitWrites(KvTransfer& t, uint64_t tag, double max_s = 5) {
    double deadline = NowS() + max_s;
    while (t.WritesPending(tag)) {
      if (NowS() > deadline) return false;
      t.Wait(50);
    }
    return true;
  }

  std::unique_ptr<RedisServer> redis_;
};

TEST_F(RedisTest, GetAndSetRoundTrip) {
  auto store = Connected();
  ASSERT_NE(store, nullptr);
  std::string binary("\0\r\n$-1\r\n*", 9);
  std::string big(1 << 20, 'b');
  big[12345] = 'c';
  ASSERT_TRUE(store->Set({{"a", "1"}, {"bin", binary}, {"big", big}}, 60).ok());
  auto got = store->Get(std::vector<std::string>{"a", "missing", "bin", "big"});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 4u);
  EXPECT_EQ((*got)[0], std::optional<std::string>("1"));
  EXPECT_EQ((*got)[1], std::nullopt);
  EXPECT_EQ((*got)[2], std::optional<std::string>(binary));
  EXPECT_EQ((*got)[3], std::optional<std::string>(big));
  auto none = store->Get({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(store->Set({{"a", "2"}}, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RedisTest, ValuesExpireAfterTheirTtl) {
  auto store = Connected();
  ASSERT_NE(store, nullptr);
  KvStoreOptions o = Options();
  o.ttl_s = 1;
  {
    KvTransfer transfer(o);
    transfer.Write(1, "through_transfer", "v");
    ASSERT_TRUE(AwaitWrites(transfer, 1));
    EXPECT_EQ(transfer.Stats().writes, 1);
  }
  ASSERT_TRUE(store->Set({{"short", "v"}}, 1).ok());
  ASSERT_TRUE(store->Set({{"long", "v"}}, 60).ok());
  std::vector<std::string> keys = {"through_transfer", "short", "long"};
  auto before = store->Get(keys);
  ASSERT_TRUE(before.ok()) << before.status();
  for (const auto& v : *before) EXPECT_TRUE(v.has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  auto after = store->Get(keys);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)[0], std::nullopt);
  EXPECT_EQ((*after)[1], std::nullopt);
  EXPECT_EQ((*after)[2], std::optional<std::string>("v"));
}

// A connection closed while idle (here by a restart) costs no call an error: the next one
// reconnects and runs again, once.
TEST_F(RedisTest, ConnectionLostWhileIdleIsReopened) {
  auto store = Connected();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set({{"before", "1"}}, 60).ok());
  ASSERT_TRUE(redis_->Restart().ok());
  auto got = store->Get(std::vector<std::string>{"before"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], std::nullopt);  // the restarted server starts empty
  ASSERT_TRUE(redis_->Restart().ok());
  EXPECT_TRUE(store->Set({{"after", "2"}}, 60).ok());
  auto after = store->Get(std::vector<std::string>{"after"});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)[0], std::optional<std::string>("2"));
  // A store that stays down fails at once, and the failure is not retried in a loop.
  redis_->Kill();
  double t0 = NowS();
  EXPECT_EQ(store->Get(std::vector<std::string>{"after"}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store->Get(std::vector<std::string>{"after"}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(NowS() - t0, 0.5);
}

// A loopback port with nothing listening: bound, then closed.
int UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST_F(RedisTest, ConnectFailsFastWhenTheStoreIsDown) {
  // A long timeout, so that failing fast cannot be mistaken for timing out.
  KvStoreOptions missing = Options(2000);
  missing.url.path += ".absent";
  double t0 = NowS();
  auto no_socket = KvStore::Connect(missing);
  EXPECT_EQ(no_socket.status().code(), absl::StatusCode::kUnavailable) << no_socket.status();
  EXPECT_LT(NowS() - t0, 0.5);

  KvStoreOptions refused = Options(2000);
  refused.url = KvStoreUrl();
  refused.url.host = "127.0.0.1";
  refused.url.port = UnusedPort();
  t0 = NowS();
  auto no_listener = KvStore::Connect(refused);
  EXPECT_EQ(no_listener.status().code(), absl::StatusCode::kUnavailable) << no_listener.status();
  EXPECT_LT(NowS() - t0, 0.5);

  redis_->Pause();
  t0 = NowS();
  auto paused = KvStore::Connect(Options(100));
  double waited = NowS() - t0;
  redis_->Resume();
  EXPECT_EQ(paused.status().code(), absl::StatusCode::kDeadlineExceeded) << paused.status();
  EXPECT_GE(waited, 0.09);
  EXPECT_LT(waited, 0.6);
}

TEST_F(RedisTest, PasswordAndDb) {
  RedisServer locked({"--requirepass", "s3cret"});
  ASSERT_TRUE(locked.Start().ok());
  KvStoreOptions o = Options();
  auto url = ParseKvStoreUrl(locked.url() + "?password=s3cret&db=1");
  ASSERT_TRUE(url.ok());
  o.url = *url;
  auto in_db1 = KvStore::Connect(o);
  ASSERT_TRUE(in_db1.ok()) << in_db1.status();
  ASSERT_TRUE((*in_db1)->Set({{"k", "one"}}, 60).ok());
  o.url.db = 0;
  auto in_db0 = KvStore::Connect(o);
  ASSERT_TRUE(in_db0.ok()) << in_db0.status();
  auto from_db0 = (*in_db0)->Get(std::vector<std::string>{"k"});
  ASSERT_TRUE(from_db0.ok());
  EXPECT_EQ((*from_db0)[0], std::nullopt);
  auto from_db1 = (*in_db1)->Get(std::vector<std::string>{"k"});
  ASSERT_TRUE(from_db1.ok());
  EXPECT_EQ((*from_db1)[0], std::optional<std::string>("one"));

  o.url.password = "wr0ng";
  auto wrong = KvStore::Connect(o);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
  EXPECT_EQ(wrong.status().message().find("wr0ng"), absl::string_view::npos) << wrong.status();
  o.url.password = "";
  auto without = KvStore::Connect(o);
  EXPECT_EQ(without.status().code(), absl::StatusCode::kPermissionDenied) << without.status();
  o.url.password = "s3cret";
  o.url.db = 100000;
  auto bad_db = KvStore::Connect(o);
  EXPECT_EQ(bad_db.status().code(), absl::StatusCode::kFailedPrecondition) << bad_db.status();
}

TEST_F(RedisTest, FetchReturnsTheLongestPresentRun) {
  auto store = Connected();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set({{"k0", "v0"}, {"k1", "value1"}, {"k3", "v3"}}, 60).ok());
  KvTransfer transfer(Options());
  KvFetchResult r = Await(transfer, transfer.Fetch({"k0", "k1", "k2", "k3"}));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.values, (std::vector<std::string>{"v0", "value1"}));
  EXPECT_GT(r.seconds, 0);
  KvFetchResult first_missing = Await(transfer, transfer.Fetch({"k2", "k0"}));
  ASSERT_TRUE(first_missing.status.ok()) << first_missing.status;
  EXPECT_TRUE(first_missing.values.empty());
  KvStoreStats s = transfer.Stats();
  EXPECT_EQ(s.fetches, 2);
  EXPECT_EQ(s.hit_blocks, 2);
  EXPECT_EQ(s.miss_blocks, 4);
  EXPECT_EQ(s.read_bytes, 8);
  EXPECT_EQ(s.timeouts + s.errors, 0);
  EXPECT_GE(s.fetch_seconds, r.seconds + first_missing.seconds - 1e-9);
}

TEST_F(RedisTest, FetchRunsAcrossMgetChunks) {
  auto store = Connected();
  ASSERT_NE(store, nullptr);
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<std::string> keys;  // [150]
  for (int i = 0; i < 150; ++i) {
    keys.push_back(absl::StrCat("c", i));
    if (i != 130) items.emplace_back(keys.back(), absl::StrCat("v", i));
  }
  ASSERT_TRUE(store->Set(items, 60).ok());
  KvTransfer transfer(Options());
  KvFetchResult r = Await(transfer, transfer.Fetch(keys));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.values.size(), 130u);
  EXPECT_EQ(r.values[0], "v0");
  EXPECT_EQ(r.values[129], "v129");
  EXPECT_EQ(transfer.Stats().miss_blocks, 20);
}

TEST_F(RedisTest, KilledStoreFailsFastAndRestartRecovers) {
  KvTransfer transfer(Options());
  transfer.Write(1, "a", "1");
  ASSERT_TRUE(AwaitWrites(transfer, 1));
  ASSERT_TRUE(Await(transfer, transfer.Fetch({"a"})).status.ok());

  redis_->Kill();
  for (int i = 0; i < 3; ++i) {
    KvFetchResult r = Await(transfer, transfer.Fetch({"a"}));
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
    EXPECT_TRUE(r.values.empty());
    EXPECT_LT(r.seconds, 0.3);
  }
  transfer.Write(2, "b", "2");
  ASSERT_TRUE(AwaitWrites(transfer, 2));
  KvStoreStats down = transfer.Stats();
  EXPECT_EQ(down.errors, 4);  // three fetches, one write
  EXPECT_EQ(down.miss_blocks, 3);  // each failed fetch's one key: recomputed
  EXPECT_EQ(down.timeouts, 0);
  EXPECT_EQ(down.dropped_writes, 1);
  EXPECT_EQ(down.writes, 1);

  ASSERT_TRUE(redis_->Restart().ok());
  double t0 = NowS();
  bool back = false;
  while (!back && NowS() - t0 < 3) {
    back = Await(transfer, transfer.Fetch({"a"})).status.ok();
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(back) << "no fetch succeeded within 3 s of the restart";
  EXPECT_LT(NowS() - t0, 2.0);
  transfer.Write(3, "c", "3");
  ASSERT_TRUE(AwaitWrites(transfer, 3));
  KvFetchResult r = Await(transfer, transfer.Fetch({"c"}));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.values, std::vector<std::string>{"3"});  // "a" went with the killed server's memory
}

TEST_F(RedisTest, StoreDownAtStartIsOnlyFastErrors) {
  redis_->Kill();
  KvTransfer transfer(Options());
  KvFetchResult down = Await(transfer, transfer.Fetch({"s"}));
  EXPECT_EQ(down.status.code(), absl::StatusCode::kUnavailable) << down.status;
  EXPECT_LT(down.seconds, 0.3);
  transfer.Write(1, "s", "v");
  ASSERT_TRUE(AwaitWrites(transfer, 1));
  EXPECT_EQ(transfer.Stats().dropped_writes, 1);
  ASSERT_TRUE(redis_->Start().ok());
  double t0 = NowS();
  bool up = false;
  while (!up && NowS() - t0 < 3) {
    up = Await(transfer, transfer.Fetch({"s"})).status.ok();
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(up) << "no fetch succeeded within 3 s of the start";
  EXPECT_LT(NowS() - t0, 2.0);
}

TEST(KvStoreOptionsTest, OutOfRangeOptionsAreRefused) {
  KvStoreOptions o;
  o.url.path = "/nonexistent.sock";
  o.timeout_ms = 0;
  EXPECT_EQ(KvStore::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStore::ConnectLazily(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.timeout_ms = 100;
  o.ttl_s = 0;
  EXPECT_EQ(KvStore::ConnectLazily(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.ttl_s = 60;
  auto lazy = KvStore::ConnectLazily(o);  // no connection yet: the missing socket shows on the first call
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  EXPECT_EQ((*lazy)->Get(std::vector<std::string>{"k"}).status().code(), absl::StatusCode::kUnavailable);
  // A transfer over options out of range fails every call with the reason, and says so in its counts.
  o.ttl_s = -1;
  KvTransfer transfer(o);
  uint64_t ticket = transfer.Fetch({"k"});
  double t0 = NowS();
  std::vector<KvFetchResult> done;
  while (done.empty() && NowS() - t0 < 5) {
    transfer.Wait(100);
    done = transfer.TakeFetched();
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].ticket, ticket);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kInvalidArgument) << done[0].status;
  EXPECT_EQ(transfer.Stats().errors, 1);
}

TEST_F(RedisTest, PausedStoreTimesOutAndResumeRecovers) {
  KvTransfer transfer(Options(150));
  ASSERT_TRUE(Await(transfer, transfer.Fetch({"x"})).status.ok());
  redis_->Pause();
  KvFetchResult r = Await(transfer, transfer.Fetch({"x"}));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_GE(r.seconds, 0.14);
  EXPECT_LT(r.seconds, 0.8);
  EXPECT_EQ(transfer.Stats().timeouts, 1);
  redis_->Resume();
  double t0 = NowS();
  bool back = false;
  while (!back && NowS() - t0 < 3) {
    back = Await(transfer, transfer.Fetch({"x"})).status.ok();
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(back) << "no fetch succeeded within 3 s of the resume";
  EXPECT_EQ(transfer.Stats().timeouts, 1);
}

TEST_F(RedisTest, WritesPendingUntilTheWriteLands) {
  KvTransfer transfer(Options(3000));  // a paused store holds the write in flight, not failed
  ASSERT_TRUE(Await(transfer, transfer.Fetch({"w"})).status.ok());
  redis_->Pause();
  transfer.Write(7, "w", "landed");
  EXPECT_TRUE(transfer.WritesPending(7));
  EXPECT_FALSE(transfer.WritesPending(8));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(transfer.WritesPending(7));
  redis_->Resume();
  double t0 = NowS();
  ASSERT_TRUE(AwaitWrites(transfer, 7, 2.5));
  EXPECT_LT(NowS() - t0, 1.0);
  KvStoreStats s = transfer.Stats();
  EXPECT_EQ(s.writes, 1);
  EXPECT_EQ(s.written_bytes, 6);
  EXPECT_EQ(s.dropped_writes, 0);
  KvFetchResult r = Await(transfer, transfer.Fetch({"w"}));
  EXPECT_EQ(r.values, std::vector<std::string>{"landed"});
}

TEST_F(RedisTest, WritesBeyondMaxPendingBytesAreDropped) {
  KvStoreOptions o = Options(3000);
  o.max_pending_bytes = 1000;
  KvTransfer transfer(o);
  ASSERT_TRUE(Await(transfer, transfer.Fetch({"p0"})).status.ok());
  redis_->Pause();  // nothing drains: the queued bytes only grow
  std::string value(398, 'v');
  for (int i = 0; i < 3; ++i) transfer.Write(i, absl::StrCat("p", i), value);  // 400 bytes each
  EXPECT_EQ(transfer.Stats().dropped_writes, 1);
  EXPECT_FALSE(transfer.WritesPending(2));
  redis_->Resume();
  ASSERT_TRUE(AwaitWrites(transfer, 0) && AwaitWrites(transfer, 1));
  KvStoreStats s = transfer.Stats();
  EXPECT_EQ(s.writes, 2);
  EXPECT_EQ(s.dropped_writes, 1);
  KvFetchResult r = Await(transfer, transfer.Fetch({"p0", "p1", "p2"}));
  EXPECT_EQ(r.values.size(), 2u);
  // With the queue drained, a write of the same size is taken again.
  transfer.Write(3, "p2", value);
  ASSERT_TRUE(AwaitWrites(transfer, 3));
  EXPECT_EQ(transfer.Stats().writes, 3);
}

TEST_F(RedisTest, FetchesGoBeforeQueuedWrites) {
  KvTransfer transfer(Options(3000));
  ASSERT_TRUE(Await(transfer, transfer.Fetch({"q"})).status.ok());
  redis_->Pause();
  transfer.Write(1, "first", "1");  // taken by the I/O thread, held in flight by the pause
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  transfer.Write(2, "later", "2");  // queued behind it
  uint64_t ticket = transfer.Fetch({"later"});
  redis_->Resume();
  KvFetchResult r = Await(transfer, ticket);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.values.empty()) << "the queued write ran before the fetch";
  ASSERT_TRUE(AwaitWrites(transfer, 2));
  EXPECT_EQ(Await(transfer, transfer.Fetch({"later"})).values, std::vector<std::string>{"2"});
}

TEST_F(RedisTest, DestructorFinishesQueuedWrites) {
  std::vector<std::string> keys;  // [200]
  {
    KvTransfer transfer(Options());
    for (int i = 0; i < 200; ++i) {
      keys.push_back(absl::StrCat("d", i));
      transfer.Write(i % 3, keys.back(), std::string(1000, 'a' + i % 26));
    }
  }
  auto store = Connected();
  ASSERT_NE(store, nullptr);
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ((*got)[i], std::optional<std::string>(std::string(1000, 'a' + i % 26))) << keys[i];
  }
}

TEST_F(RedisTest, WaitReturnsWhenStoreWorkFinishes) {
  KvTransfer transfer(Options());
  double t0 = NowS();
  transfer.Wait(80);  // nothing queued: the whole wait
  EXPECT_GE(NowS() - t0, 0.075);
  uint64_t ticket = transfer.Fetch({"none"});
  t0 = NowS();
  while (transfer.Stats().fetches == 0 && NowS() - t0 < 5) transfer.Wait(5000);
  EXPECT_LT(NowS() - t0, 2.0);
  std::vector<KvFetchResult> done = transfer.TakeFetched();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].ticket, ticket);
  transfer.Write(4, "wait", "v");
  t0 = NowS();
  while (transfer.WritesPending(4) && NowS() - t0 < 5) transfer.Wait(5000);
  EXPECT_FALSE(transfer.WritesPending(4));
  EXPECT_LT(NowS() - t0, 2.0);
}

// The engine thread queues and takes while another thread reads the statistics (run under TSan by
// scripts/tsan.sh): every call is accounted for.
TEST_F(RedisTest, ConcurrentCallersAreAccountedFor) {
  KvTransfer transfer(Options());
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      KvStoreStats s = transfer.Stats();
      EXPECT_LE(s.hit_blocks + s.miss_blocks, 2 * s.fetches);
      transfer.WritesPending(1);
    }
  });
  int taken = 0;
  for (int i = 0; i < 100; ++i) {
    transfer.Write(i % 4, absl::StrCat("t", i), "v");
    transfer.Fetch({absl::StrCat("t", i), absl::StrCat("t", i + 1)});
    taken += static_cast<int>(transfer.TakeFetched().size());
  }
  double t0 = NowS();
  while (taken < 100 && NowS() - t0 < 10) {
    transfer.Wait(100);
    taken += static_cast<int>(transfer.TakeFetched().size());
  }
  for (uint64_t tag = 0; tag < 4; ++tag) EXPECT_TRUE(AwaitWrites(transfer, tag));
  done = true;
  reader.join();
  EXPECT_EQ(taken, 100);
  KvStoreStats s = transfer.Stats();
  EXPECT_EQ(s.fetches, 100);
  EXPECT_EQ(s.writes + s.dropped_writes, 100);
  EXPECT_EQ(s.hit_blocks + s.miss_blocks, 200);
}

}  // namespace
}  // namespace specula
