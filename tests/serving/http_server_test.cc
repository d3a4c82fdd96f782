// HttpServer (serving/http_server.h) with toy handlers, driven over loopback by a raw-socket
// client (plaintext) and Boost.Asio's SSL stream (TLS).
#include "serving/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Latency bounds stretch under a sanitizer (the tsan preset sets SPECULA_SANITIZER); the checks stay.
int64_t Scaled(int64_t ms) {
  const char* s = std::getenv("SPECULA_SANITIZER");
  return s != nullptr && *s != '\0' ? ms * 10 : ms;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  for (size_t off = 0; off < s.size();) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads into `buf` until `done(buf)` or end of stream or `timeout`; false on timeout.
template <class Done>
bool ReadUntil(int fd, std::string* buf, Done done, std::chrono::milliseconds timeout = 5000ms) {
  const auto end = Clock::now() + timeout;
  while (!done(*buf)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char tmp[65536];
    const ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return done(*buf);
    buf->append(tmp, static_cast<size_t>(n));
  }
  return true;
}

struct Response {
  int status = 0;
  std::string head, body;  // body de-chunked
  bool closed = false;     // the server closed the connection after it
};

// Parses one response from `buf` (Content-Length or chunked); false if incomplete.
bool ParseResponse(const std::string& buf, Response* r, size_t* used) {
  const size_t eoh = buf.find("\r\n\r\n");
  if (eoh == std::string::npos) return false;
  r->head = buf.substr(0, eoh);
  r->status = std::atoi(buf.c_str() + 9);
  size_t pos = eoh + 4;
  const size_t cl = r->head.find("Content-Length: ");
  if (cl != std::string::npos) {
    const size_t n = std::strtoul(r->head.c_str() + cl + 16, nullptr, 10);
    if (buf.size() < pos + n) return false;
    r->body = buf.substr(pos, n);
    *used = pos + n;
    return true;
  }
  r->body.clear();
  for (;;) {  // chunked
    const size_t eol = buf.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    const size_t n = std::strtoul(buf.c_str() + pos, nullptr, 16);
    if (buf.size() < eol + 2 + n + 2) return false;
    r->body += buf.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
    if (n == 0) break;
  }
  *used = pos;
  return true;
}

// Sends `request` and reads one response on `fd` (keeps what follows in `rest`).
Response Exchange(int fd, const std::string& request, std::string* rest = nullptr, std::chrono::milliseconds timeout = 5000ms) {
  Response r;
  std::string local, &buf = rest ? *rest : local;
  if (!request.empty()) {
    EXPECT_TRUE(SendAll(fd, request));
  }
  size_t used = 0;
  EXPECT_TRUE(ReadUntil(fd, &buf, [&](const std::string& b) { return ParseResponse(b, &r, &used); }, timeout))
      << "no complete response; got: " << buf.substr(0, 300);
  buf.erase(0, used);
  return r;
}

bool ClosedByPeer(int fd, std::chrono::milliseconds timeout = 3000ms) {
  std::string junk;
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char tmp[4096];
    const ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return true;
  }
  return false;
}

std::string Get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
         "\r\n" + body;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Serve(HttpServerOptions o = {}, std::vector<HttpRoute> extra = {}) {
    std::vector<HttpRoute> routes = {
        {"GET", "/hello", [](HttpRequest q, std::shared_ptr<HttpExchange> ex) {
           ex->Respond(200, "text/plain", "hello " + q.query, {{"X-Seen", q.Header("x-test")}});
         }},
        {"POST", "/echo", [](HttpRequest q, std::shared_ptr<HttpExchange> ex) {
           ex->Respond(200, "application/octet-stream", q.body);
         }},
        {"GET", "/health", [](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->Respond(200, "", ""); }},
    };
    for (auto& r : extra) routes.push_back(std::move(r));
    auto s = HttpServer::Start(std::move(o), std::move(routes));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  int port() const { return server_->port(); }
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, RoutesWithQueryAndHeaders) {
  Serve();
  const int fd = Connect(port());
  Response r = Exchange(fd, Get("/hello?name=x", "X-Test: yes\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello name=x");
  EXPECT_NE(r.head.find("X-Seen: yes"), std::string::npos) << r.head;
  close(fd);
}

TEST_F(HttpServerTest, UnknownRouteIs404AndWrongMethodIs405InOpenAiShape) {
  Serve();
  const int fd = Connect(port());
  Response r = Exchange(fd, Get("/nope"));
  EXPECT_EQ(r.status, 404);
  const auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], 404);
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"]["param"].is_null());
  const int fd2 = Connect(port());
  r = Exchange(fd2, Post("/hello", "x"));
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("Allow: GET"), std::string::npos) << r.head;
  close(fd);
  close(fd2);
}

TEST_F(HttpServerTest, KeepAliveServesManyRequestsOnOneConnectionAndPipelines) {
  Serve();
  const int fd = Connect(port());
  std::string rest;
  for (int i = 0; i < 5; ++i) {
    Response r = Exchange(fd, Post("/echo", "body" + std::to_string(i)), &rest);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "body" + std::to_string(i));
  }
  ASSERT_TRUE(SendAll(fd, Post("/echo", "a") + Post("/echo", "b")));  // pipelined: answered in order
  EXPECT_EQ(Exchange(fd, "", &rest).body, "a");
  EXPECT_EQ(Exchange(fd, "", &rest).body, "b");
  Response last = Exchange(fd, Get("/hello", "Connection: close\r\n"), &rest);
  EXPECT_NE(last.head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);
}

TEST_F(HttpServerTest, HugeContentLengthIs413AtOnceWithoutReadingTheBody) {
  HttpServerOptions o;
  o.max_body_bytes = 1 << 20;
  Serve(o);
  const int fd = Connect(port());
  const auto t0 = Clock::now();
  Response r = Exchange(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 68719476736\r\n\r\n");
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  EXPECT_EQ(r.status, 413);
  EXPECT_LT(ms, Scaled(500));
  EXPECT_EQ(nlohmann::json::parse(r.body)["error"]["code"], 413);
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);
}

TEST_F(HttpServerTest, ChunkedBodyPastTheLimitIs413) {
  HttpServerOptions o;
  o.max_body_bytes = 1000;
  Serve(o);
  const int fd = Connect(port());
  std::string req = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) req += "200\r\n" + std::string(512, 'a') + "\r\n";
  Response r = Exchange(fd, req);
  EXPECT_EQ(r.status, 413);
  close(fd);
  const int ok = Connect(port());
  r = Exchange(ok, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "abc");
  close(ok);
}

TEST_F(HttpServerTest, HugeHeaderIs431) {
  HttpServerOptions o;
  o.max_header_bytes = 4096;
  Serve(o);
  const int fd = Connect(port());
  Response r = Exchange(fd, Get("/hello", "X-Big: " + std::string(8000, 'b') + "\r\n"));
  EXPECT_EQ(r.status, 431);
  close(fd);
}

TEST_F(HttpServerTest, ApiKeyGuardsAllButOpenPaths) {
  HttpServerOptions o;
  o.security.api_key = "sekret";
  Serve(o);
  for (const std::string& auth : {std::string(), std::string("Authorization: Bearer wrong!\r\n")}) {
    const int fd = Connect(port());
    Response r = Exchange(fd, Post("/echo", "x", auth));
    EXPECT_EQ(r.status, 401) << auth;
    EXPECT_NE(r.head.find("WWW-Authenticate: Bearer"), std::string::npos);
    const auto j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["error"]["code"], 401);
    EXPECT_TRUE(j["error"]["param"].is_null());
    close(fd);
  }
  // Refused before the body: a huge declared body without the key is a 401, not a 413.
  int fd = Connect(port());
  EXPECT_EQ(Exchange(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n").status, 401);
  close(fd);
  fd = Connect(port());
  Response r = Exchange(fd, Post("/echo", "x", "Authorization: Bearer sekret\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "x");
  EXPECT_EQ(Exchange(fd, Get("/health")).status, 200);  // open path, same connection
  close(fd);
}

// A stream written from another thread, the way the engine loop's callbacks answer.
TEST_F(HttpServerTest, StreamWrittenFromAnotherThreadArrivesInOrder) {
  std::vector<std::thread> writers;
  std::mutex mu;
  Serve({}, {{"GET", "/stream", [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
                std::lock_guard<std::mutex> l(mu);
                writers.emplace_back([ex] {
                  ex->StartStream(200, "text/event-stream");
                  for (int i = 0; i < 200; ++i) ex->Write("data: " + std::to_string(i) + "\n\n");
                  ex->End();
                });
              }}});
  const int fd = Connect(port());
  Response r = Exchange(fd, Get("/stream"));
  std::string want;
  for (int i = 0; i < 200; ++i) want += "data: " + std::to_string(i) + "\n\n";
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.head.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_EQ(r.body, want);
  EXPECT_EQ(Exchange(fd, Get("/hello")).status, 200);  // the connection is kept alive after the stream
  close(fd);
  std::lock_guard<std::mutex> l(mu);
  for (auto& t : writers) t.join();
}

TEST_F(HttpServerTest, OnCloseFiresWhenTheClientLeavesMidStream) {
  std::promise<void> closed;
  std::shared_ptr<HttpExchange> kept;
  std::mutex mu;
  Serve({}, {{"GET", "/stream", [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
                {
                  // Kept before the first byte goes out: the client may read it, leave, and the
                  // test check `kept` before this handler returns.
                  std::lock_guard<std::mutex> l(mu);
                  kept = ex;  // never ended: the client leaves first
                }
                ex->OnClose([&] { closed.set_value(); });
                ex->StartStream(200, "text/event-stream");
                ex->Write("data: first\n\n");
              }}});
  const int fd = Connect(port());
  ASSERT_TRUE(SendAll(fd, Get("/stream")));
  std::string buf;
  ASSERT_TRUE(ReadUntil(fd, &buf, [](const std::string& b) { return b.find("first") != std::string::npos; }));
  close(fd);
  EXPECT_EQ(closed.get_future().wait_for(3s), std::future_status::ready);
  std::lock_guard<std::mutex> l(mu);
  ASSERT_NE(kept, nullptr);
  EXPECT_TRUE(kept->peer_gone());
  EXPECT_FALSE(kept->Write("data: late\n\n"));
}

TEST_F(HttpServerTest, AHandlerThatNeverAnswersGivesA500) {
  Serve({}, {{"GET", "/silent", [](HttpRequest, std::shared_ptr<HttpExchange>) {}}});
  const int fd = Connect(port());
  EXPECT_EQ(Exchange(fd, Get("/silent")).status, 500);
  EXPECT_EQ(Exchange(fd, Get("/hello")).status, 200);
  close(fd);
}

// The server's own headers go out on every kind of response: a handler's, a stream's head, an early
// refusal before any handler runs (401 without the key, 404, 413), and the 500 of a silent handler.
TEST_F(HttpServerTest, ResponseHeadersGoOutOnEveryResponse) {
  HttpServerOptions o;
  o.security.api_key = "sekret";
  o.max_body_bytes = 100;
  o.response_headers = {{"X-Specula-Replica", "r-7"}};
  Serve(o, {{"GET", "/stream", [](HttpRequest, std::shared_ptr<HttpExchange> ex) {
               ex->StartStream(200, "text/event-stream");
               ex->Write("data: x\n\n");
               ex->End();
             }},
            {"GET", "/silent", [](HttpRequest, std::shared_ptr<HttpExchange>) {}}});
  const std::string auth = "Authorization: Bearer sekret\r\n";
  const std::string want = "\r\nX-Specula-Replica: r-7";
  struct Case {
    std::string request;
    int status;
  };
  const std::vector<Case> cases = {
      {Get("/hello", auth + "X-Test: yes\r\n"), 200},
      {Get("/stream", auth), 200},
      {Get("/silent", auth), 500},
      {Get("/health"), 200},  // open: no key
      {Get("/hello"), 401},
      {Get("/nope", auth), 404},
      {"POST /echo HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 1000\r\n\r\n", 413},
  };
  for (const Case& c : cases) {
    const int fd = Connect(port());
    const Response r = Exchange(fd, c.request);
    EXPECT_EQ(r.status, c.status) << c.request;
    EXPECT_NE((r.head + "\r\n").find(want + "\r\n"), std::string::npos) << c.request << "\n" << r.head;
    if (c.status == 200 && c.request.starts_with("GET /hello")) {
      EXPECT_NE(r.head.find("X-Seen: yes"), std::string::npos) << r.head;  // the handler's own still there
    }
    if (c.status == 401) EXPECT_NE(r.head.find("WWW-Authenticate: Bearer"), std::string::npos) << r.head;
    close(fd);
  }
}

// Without response headers nothing is added.
TEST_F(HttpServerTest, NoResponseHeadersAddNothing) {
  Serve();
  const int fd = Connect(port());
  const Response r = Exchange(fd, Get("/nope"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.head.find("X-Specula-Replica"), std::string::npos) << r.head;
  close(fd);
}

TEST_F(HttpServerTest, SlowHeadersAreCutOffAndIdleConnectionsBlockNobody) {
  HttpServerOptions o;
  o.header_timeout = 300ms;
  o.worker_threads = 1;
  Serve(o);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(Connect(port()));
    SendAll(idle.back(), "GET /hello HTTP/1.1\r\nHost");  // never finished
  }
  const int fd = Connect(port());
  const auto t0 = Clock::now();
  EXPECT_EQ(Exchange(fd, Get("/hello")).status, 200);
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(), Scaled(200));
  EXPECT_TRUE(ClosedByPeer(idle[0], 3000ms));  // the header deadline
  for (int f : idle) close(f);
  close(fd);
}

TEST_F(HttpServerTest, ATakenPortFailsToStart) {
  Serve();
  HttpServerOptions o;
  o.port = port();
  auto second = HttpServer::Start(o, {});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(std::to_string(port())), std::string_view::npos) << second.status();
}

}  // namespace
}  // namespace specula
