#include "serving/http_server.h"

#include <netinet/tcp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kHeaderReadBytes = 4 << 10;  // per read while idle or in the headers: an idle connection's buffer
constexpr size_t kBodyReadBytes = 64 << 10;
constexpr size_t kMaxQueuedBytes = size_t{32} << 20;  // a response the peer does not read: it is dropped
constexpr auto kLinger = std::chrono::seconds(2);     // reading what a refused client still sends, before close

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Reason(int status) {
  const auto r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r == "<unknown-status>" ? std::string("Status") : std::string(r);
}

// The status line and headers: the response's own (`extra`), then the server's (`common`, on every
// response). `length` nullopt: chunked.
std::string Head(int status, std::string_view content_type, std::optional<size_t> length, const HttpHeaders& extra,
                 const HttpHeaders& common, bool keep_alive) {
  std::string h = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n");
  if (!content_type.empty()) absl::StrAppend(&h, "Content-Type: ", std::string(content_type), "\r\n");
  if (length) {
    absl::StrAppend(&h, "Content-Length: ", *length, "\r\n");
  } else {
    absl::StrAppend(&h, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
  }
  if (!keep_alive) absl::StrAppend(&h, "Connection: close\r\n");
  for (const auto& [k, v] : extra) absl::StrAppend(&h, k, ": ", v, "\r\n");
  for (const auto& header : common) {
    // A handler's own value wins over the server's (a response's model version over the current one).
    const std::string& name = header.first;
    const bool own =
        std::any_of(extra.begin(), extra.end(), [&name](const auto& e) { return absl::EqualsIgnoreCase(e.first, name); });
    if (!own) absl::StrAppend(&h, name, ": ", header.second, "\r\n");
  }
  h += "\r\n";
  return h;
}

// What an exchange may outlive: Stop() closes the gate, after which nothing is posted to the
// (soon destroyed) io_context. It holds the headers of every response, which an exchange's last
// answer (its destructor's 500) may need after the server is gone.
struct Gate {
  explicit Gate(HttpHeaders headers) : headers_(std::move(headers)) {}
  HttpHeaders response_headers() {
    std::lock_guard<std::mutex> l(mu);
    return headers_;
  }
  void Set(const std::string& name, const std::string& value) {
    std::lock_guard<std::mutex> l(mu);
    for (auto& [k, v] : headers_) {
      if (k == name) {
        v = value;
        return;
      }
    }
    headers_.emplace_back(name, value);
  }
  std::mutex mu;
  bool stopped = false;  // guarded by mu

 private:
  HttpHeaders headers_;  // HttpServerOptions::response_headers, and SetResponseHeader's; guarded by mu
};

// The connection as its exchange sees it; every method runs on the connection's strand.
class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  virtual void Post(std::function<void()> f) = 0;
  virtual void Deliver(uint64_t request, std::string bytes, bool end) = 0;
  virtual void Start() = 0;
  virtual void CloseNow() = 0;
};

class ExchangeImpl final : public HttpExchange {
 public:
  ExchangeImpl(std::shared_ptr<Gate> gate, std::weak_ptr<SessionBase> session, uint64_t request, bool keep_alive,
               asio::thread_pool* workers)
      : gate_(std::move(gate)), session_(std::move(session)), request_(request), keep_alive_(keep_alive),
        workers_(workers) {}

  // A handler that never answered: the client still gets a response rather than a hung connection.
  ~ExchangeImpl() override {
    std::lock_guard<std::mutex> l(mu_);
    if (state_ == kStreaming) Send("0\r\n\r\n", true);
    if (state_ == kNew) {
      const std::string body = HttpErrorJson(500, "the handler did not respond", "internal_error");
      Send(Head(500, "application/json", body.size(), {}, gate_->response_headers(), keep_alive_) + body, true);
    }
  }

  void Respond(int status, std::string content_type, std::string body, HttpHeaders extra = {}) override {
    std::lock_guard<std::mutex> l(mu_);
    if (state_ != kNew) return;
    state_ = kEnded;
    std::string bytes = Head(status, content_type, body.size(), extra, gate_->response_headers(), keep_alive_);
    bytes += body;
    Send(std::move(bytes), true);
  }

  void StartStream(int status, std::string content_type, HttpHeaders extra = {}) override {
    std::lock_guard<std::mutex> l(mu_);
    if (state_ != kNew) return;
    state_ = kStreaming;
    Send(Head(status, content_type, std::nullopt, extra, gate_->response_headers(), keep_alive_), false);
  }

  bool Write(std::string chunk) override {
    std::lock_guard<std::mutex> l(mu_);
    if (state_ != kStreaming || gone_) return false;
    if (chunk.empty()) return true;  // an empty chunk would end the stream
    char size[20];
    std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
    Send(absl::StrCat(size, chunk, "\r\n"), false);
    return true;
  }

  void End() override {
    std::lock_guard<std::mutex> l(mu_);
    if (state_ != kStreaming) return;
    state_ = kEnded;
    Send("0\r\n\r\n", true);
  }

  void OnClose(std::function<void()> f) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!gone_) {
        on_close_ = std::move(f);
        return;
      }
    }
    f();
  }

  bool peer_gone() const override { return gone_; }

  void Defer(std::function<void()> f) override {
    std::lock_guard<std::mutex> g(gate_->mu);  // the pool is joined only after the gate closes
    if (!gate_->stopped) asio::post(*workers_, std::move(f));
  }

  // From the session's strand: the peer went away (or the connection broke) before the end.
  void PeerGone() {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (gone_ || state_ == kEnded) return;
      gone_ = true;
      f = std::move(on_close_);
    }
    if (f) f();
  }

 private:
  // Called with mu_ held, so that bytes reach the strand in the order of the calls.
  void Send(std::string bytes, bool end) {
    std::lock_guard<std::mutex> g(gate_->mu);
    if (gate_->stopped) return;
    auto s = session_.lock();
    if (s == nullptr) return;
    const uint64_t request = request_;
    s->Post([s, request, bytes = std::move(bytes), end]() mutable { s->Deliver(request, std::move(bytes), end); });
  }

  enum State { kNew, kStreaming, kEnded };
  const std::shared_ptr<Gate> gate_;
  const std::weak_ptr<SessionBase> session_;
  const uint64_t request_;  // the connection's request number: a late call never reaches the next request
  const bool keep_alive_;
  asio::thread_pool* const workers_;  // the server's handler pool
  std::mutex mu_;
  State state_ = kNew;                 // guarded by mu_
  std::atomic<bool> gone_{false};      // written under mu_
  std::function<void()> on_close_;     // guarded by mu_
};

struct Route {
  std::map<std::string, HttpHandler> by_method;
};

// What the server's sessions share. Outlived by the sessions only while the io threads run.
struct Core {
  HttpServerOptions options;
  std::map<std::string, Route> routes;  // by path
  std::optional<ssl::context> tls;      // before ioc: the sessions it destroys use it
  asio::io_context ioc;
  std::optional<asio::thread_pool> workers;
  std::shared_ptr<Gate> gate;  // made by Start, with the options' response headers
  std::mutex sessions_mu;
  std::unordered_map<uint64_t, std::shared_ptr<SessionBase>> sessions;  // guarded by sessions_mu
  uint64_t next_session = 0;                                            // guarded by sessions_mu

  void Forget(uint64_t id) {
    std::lock_guard<std::mutex> l(sessions_mu);
    sessions.erase(id);
  }
};

template <class Stream>
class Session final : public SessionBase {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  template <class... Args>
  Session(Core* core, uint64_t id, Args&&... args)
      : core_(core), id_(id), stream_(std::forward<Args>(args)...), timer_(stream_.get_executor()) {}

  void Post(std::function<void()> f) override { asio::post(stream_.get_executor(), std::move(f)); }

  void Start() override {
    Post([self = Self()] { self->Begin(); });
  }

  void CloseNow() override {
    if (state_ == kClosed) return;
    state_ = kClosed;
    MarkGone();
    timer_.cancel();
    beast::error_code ec;
    Socket().shutdown(tcp::socket::shutdown_both, ec);
    Socket().close(ec);
    core_->Forget(id_);
  }

  void Deliver(uint64_t request, std::string bytes, bool end) override {
    if (state_ != kPending || request != request_) return;
    Queue(std::move(bytes));
    if (end) response_done_ = true;
    Flush();
  }

 private:
  enum State { kHandshake, kIdle, kHeader, kBody, kPending, kClosing, kClosed };

  std::shared_ptr<Session> Self() { return std::static_pointer_cast<Session>(shared_from_this()); }
  tcp::socket& Socket() {
    if constexpr (kTls) {
      return stream_.next_layer();
    } else {
      return stream_;
    }
  }

  void Begin() {
    beast::error_code ec;
    Socket().set_option(tcp::no_delay(true), ec);  // a streamed token leaves at once
    SetDeadline(Clock::now() + core_->options.header_timeout);
    if constexpr (kTls) {
      state_ = kHandshake;
      stream_.async_handshake(ssl::stream_base::server, [self = Self()](beast::error_code e) {
        if (e || self->state_ != kHandshake) return self->CloseNow();  // a plaintext client on a TLS port, too
        self->NextRequest(/*idle=*/false);
      });
    } else {
      NextRequest(/*idle=*/false);
    }
  }

  // Ready for a request: a new connection (its header deadline runs from the accept) or a
  // keep-alive one (idle deadline until its first byte).
  void NextRequest(bool idle) {
    state_ = kIdle;
    ++request_;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(core_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(std::numeric_limits<uint64_t>::max());  // Content-Length is checked after the API key
    if (idle) SetDeadline(Clock::now() + core_->options.idle_timeout);
    Process();
  }

  void SetDeadline(Clock::time_point t) {
    deadline_ = t;
    if (t == Clock::time_point::max()) {
      timer_.cancel();
      return;
    }
    timer_.expires_at(t);
    timer_.async_wait([self = Self()](beast::error_code ec) {
      if (ec || self->state_ == kClosed || Clock::now() < self->deadline_) return;  // re-armed or closed
      self->CloseNow();  // a slow header or body, an idle keep-alive, a write the peer does not read
    });
  }

  void Read() {
    if (reading_ || state_ == kClosed) return;
    reading_ = true;
    // Its own buffer: buffer_ changes (parsed bytes consumed) while this read is outstanding.
    read_buf_.resize(state_ == kBody || state_ == kClosing ? kBodyReadBytes : kHeaderReadBytes);
    stream_.async_read_some(asio::buffer(read_buf_), [self = Self()](beast::error_code ec, size_t got) {
      self->reading_ = false;
      if (ec) return self->CloseNow();  // while a response is pending: the peer went away
      self->buffer_.commit(asio::buffer_copy(self->buffer_.prepare(got), asio::buffer(self->read_buf_.data(), got)));
      self->Process();
    });
  }

  // Feeds what was read to the parser and reads on. While a response is pending the read goes on,
  // for the end of stream that says the client left; bytes it brings (a pipelined request) wait.
  void Process() {
    if (state_ == kClosing) {
      buffer_.consume(buffer_.size());
      return Read();
    }
    while ((state_ == kIdle || state_ == kHeader || state_ == kBody) && buffer_.size() > 0) {
      if (state_ == kIdle) {
        state_ = kHeader;
        SetDeadline(Clock::now() + core_->options.header_timeout);
      }
      beast::error_code ec;
      const size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == http::error::need_more) break;
      if (ec) return RejectParse(ec);
      if (state_ == kHeader && parser_->is_header_done() && !OnHeader()) return;
      if (parser_->is_done()) Dispatch();
      if (used == 0) break;
    }
    if (state_ == kPending && buffer_.size() > core_->options.max_header_bytes + kBodyReadBytes) return;
    if (state_ != kClosed) Read();
  }

  void RejectParse(const beast::error_code& ec) {
    if (ec == http::error::header_limit) {
      return Reject(431, absl::StrCat("request headers: larger than ", core_->options.max_header_bytes, " bytes"),
                    "headers");
    }
    if (ec == http::error::body_limit) {
      return Reject(413, BodyTooLarge(), "body");
    }
    Reject(400, absl::StrCat("malformed HTTP request: ", ec.message()), "");
  }

  std::string BodyTooLarge() const {
    return absl::StrCat("body: larger than ", core_->options.max_body_name, " ", core_->options.max_body_bytes);
  }

  // The checks before the body is read: API key, route, declared size. False: refused.
  bool OnHeader() {
    const auto& msg = parser_->get();
    const std::string_view target(msg.target().data(), msg.target().size());
    const std::string path(target.substr(0, target.find('?')));
    const HttpServerOptions& o = core_->options;
    const bool open = std::find(o.open_paths.begin(), o.open_paths.end(), path) != o.open_paths.end();
    const auto auth = msg[http::field::authorization];
    if (!o.security.api_key.empty() && !open &&
        !BearerMatches(std::string_view(auth.data(), auth.size()), o.security.api_key)) {
      Reject(401, auth.empty() ? "missing API key: send Authorization: Bearer <key>" : "invalid API key", "",
             {{"WWW-Authenticate", "Bearer"}});
      return false;
    }
    auto route = core_->routes.find(path);
    if (route == core_->routes.end()) {
      Reject(404, absl::StrCat("no route ", std::string(msg.method_string()), " ", path), "");
      return false;
    }
    auto handler = route->second.by_method.find(std::string(msg.method_string()));
    if (handler == route->second.by_method.end()) {
      std::string allow;
      for (const auto& [m, h] : route->second.by_method) absl::StrAppend(&allow, allow.empty() ? "" : ", ", m);
      Reject(405, absl::StrCat("method ", std::string(msg.method_string()), " not allowed on ", path), "",
             {{"Allow", allow}});
      return false;
    }
    if (parser_->content_length() && *parser_->content_length() > o.max_body_bytes) {
      Reject(413, absl::StrCat(BodyTooLarge(), " (Content-Length ", *parser_->content_length(), ")"), "body");
      return false;
    }
    parser_->body_limit(o.max_body_bytes);  // a chunked body is cut off there too
    handler_ = &handler->second;
    state_ = kBody;
    SetDeadline(Clock::now() + o.body_timeout);
    const auto expect = msg[http::field::expect];
    if (!parser_->is_done() && Lower(std::string_view(expect.data(), expect.size())) == "100-continue") {
      Queue("HTTP/1.1 100 Continue\r\n\r\n");
      Flush();
    }
    return true;
  }

  // An error answer before the handler; the connection closes after it (a body may be on its way).
  void Reject(int status, const std::string& message, const std::string& param, HttpHeaders extra = {}) {
    const char* type = status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
                                                                               : "invalid_request_error";
    const std::string body = HttpErrorJson(status, message, type, param);
    state_ = kClosing;
    SetDeadline(Clock::now() + kLinger);
    Queue(Head(status, "application/json", body.size(), extra, core_->gate->response_headers(), /*keep_alive=*/false) +
          body);
    Flush();
  }

  void Dispatch() {
    auto& msg = parser_->get();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    const std::string_view target(msg.target().data(), msg.target().size());
    const size_t q = target.find('?');
    req.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
    for (const auto& f : msg) {
      req.headers.emplace_back(Lower(std::string_view(f.name_string().data(), f.name_string().size())),
                               std::string(f.value()));
    }
    req.body = std::move(msg.body());
    const bool keep_alive = msg.keep_alive();
    close_after_ = !keep_alive;
    state_ = kPending;
    SetDeadline(Clock::time_point::max());  // the handler takes its time; the read watches for a close
    auto ex = std::make_shared<ExchangeImpl>(core_->gate, weak_from_this(), request_, keep_alive, &*core_->workers);
    exchange_ = ex;
    const HttpHandler* handler = handler_;
    asio::post(*core_->workers, [handler, req = std::move(req), ex = std::move(ex)]() mutable {
      try {
        (*handler)(std::move(req), ex);
      } catch (const std::exception& e) {
        ex->Respond(500, "application/json", HttpErrorJson(500, e.what(), "internal_error"));
      }
    });
  }

  void MarkGone() {
    if (auto ex = exchange_.lock()) ex->PeerGone();
  }

  void Queue(std::string bytes) {
    queued_bytes_ += bytes.size();
    out_.push_back(std::move(bytes));
    if (queued_bytes_ > kMaxQueuedBytes) CloseNow();  // the peer does not read what it asked for
  }

  void Flush() {
    if (writing_ || out_.empty() || state_ == kClosed) return;
    writing_ = true;
    sending_.assign(std::make_move_iterator(out_.begin()), std::make_move_iterator(out_.end()));
    out_.clear();
    std::vector<asio::const_buffer> bufs;
    for (const std::string& s : sending_) bufs.push_back(asio::buffer(s));
    if (state_ == kPending) SetDeadline(Clock::now() + core_->options.idle_timeout);  // a stalled reader
    asio::async_write(stream_, bufs, [self = Self()](beast::error_code ec, size_t n) { self->OnWritten(ec, n); });
  }

  void OnWritten(beast::error_code ec, size_t n) {
    writing_ = false;
    queued_bytes_ -= n;
    sending_.clear();
    if (ec) return CloseNow();
    if (!out_.empty()) return Flush();
    if (state_ == kPending && response_done_) return FinishResponse();
    if (state_ == kPending) SetDeadline(Clock::time_point::max());
    if (state_ == kClosing) Linger();
  }

  void FinishResponse() {
    response_done_ = false;
    exchange_.reset();
    if (close_after_) {
      state_ = kClosing;
      SetDeadline(Clock::now() + kLinger);
      return Linger();
    }
    NextRequest(/*idle=*/true);
  }

  // Closes our side's sending half, then reads (and drops) what the client still sends until it
  // closes or the linger deadline: closing with unread bytes would reset the connection, and the
  // client could lose the answer it has not read yet (a 413 before a large body).
  void Linger() {
    // Under TLS too (without a close_notify): the response is whole by its length or last chunk.
    beast::error_code ec;
    Socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return CloseNow();
    Process();
  }

  Core* const core_;
  const uint64_t id_;
  Stream stream_;
  asio::steady_timer timer_;
  Clock::time_point deadline_ = Clock::time_point::max();
  State state_ = kHandshake;
  beast::flat_buffer buffer_;      // read, not parsed yet
  std::vector<char> read_buf_;     // [kHeaderReadBytes or kBodyReadBytes]
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpHandler* handler_ = nullptr;
  uint64_t request_ = 0;
  bool reading_ = false, writing_ = false, response_done_ = false, close_after_ = false;
  std::deque<std::string> out_;
  std::vector<std::string> sending_;
  size_t queued_bytes_ = 0;
  std::weak_ptr<ExchangeImpl> exchange_;
};

}  // namespace

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "";
}

std::string HttpErrorJson(int status, std::string_view message, std::string_view type, std::string_view param) {
  nlohmann::json p = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(param));
  return nlohmann::json{{"error", {{"message", std::string(message)}, {"type", std::string(type)}, {"param", p},
                                   {"code", status}}}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct HttpServer::Impl {
  Core core;
  tcp::acceptor acceptor{asio::make_strand(core.ioc)};  // a strand: Stop closes it from another thread
  asio::steady_timer accept_backoff{acceptor.get_executor()};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> io_threads;
  int port = 0;
  bool stopped = false;

  void Accept();
  void OnAccept(const beast::error_code& ec, tcp::socket socket);
};

void HttpServer::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(core.ioc), [this](beast::error_code ec, tcp::socket s) {
    OnAccept(ec, std::move(s));
  });
}

void HttpServer::Impl::OnAccept(const beast::error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of descriptors (EMFILE): the pending connection waits in the backlog; try again soon
    // rather than spin.
    accept_backoff.expires_after(std::chrono::milliseconds(50));
    accept_backoff.async_wait([this](beast::error_code e) {
      if (!e) Accept();
    });
    return;
  }
  std::shared_ptr<SessionBase> s;
  std::lock_guard<std::mutex> l(core.sessions_mu);
  const uint64_t id = core.next_session++;
  if (core.tls) {
    s = std::make_shared<Session<ssl::stream<tcp::socket>>>(&core, id, std::move(socket), *core.tls);
  } else {
    s = std::make_shared<Session<tcp::socket>>(&core, id, std::move(socket));
  }
  core.sessions.emplace(id, s);
  s->Start();
  Accept();
}

namespace {

absl::Status SetUpTls(const SecurityOptions& sec, std::optional<ssl::context>* out) {
  out->emplace(ssl::context::tls_server);
  ssl::context& ctx = **out;
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                  ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  beast::error_code ec;
  if (ctx.use_certificate_chain_file(sec.ssl_certfile, ec); ec) {
    return absl::InvalidArgumentError(absl::StrCat("--ssl-certfile ", sec.ssl_certfile, ": ", ec.message()));
  }
  if (ctx.use_private_key_file(sec.ssl_keyfile, ssl::context::pem, ec); ec) {
    return absl::InvalidArgumentError(absl::StrCat("--ssl-keyfile ", sec.ssl_keyfile, ": ", ec.message()));
  }
  if (!sec.ssl_ca_certs.empty()) {
    if (ctx.load_verify_file(sec.ssl_ca_certs, ec); ec) {
      return absl::InvalidArgumentError(absl::StrCat("--ssl-ca-certs ", sec.ssl_ca_certs, ": ", ec.message()));
    }
    ctx.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  return absl::OkStatus();
}

// A connection is a descriptor: the soft limit (often 1024) would refuse clients long before memory.
void RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

absl::Status Listen(tcp::acceptor& acceptor, const std::string& host, int port) {
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", host, ": not an IP address"));
  const tcp::endpoint ep(address, static_cast<unsigned short>(port));
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);  // not SO_REUSEPORT: a taken port fails
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(4096, ec);  // a burst of connects must not overflow the backlog
  if (ec) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options, std::vector<HttpRoute> routes) {
  auto impl = std::make_unique<Impl>();
  Core& core = impl->core;
  core.gate = std::make_shared<Gate>(std::exchange(options.response_headers, {}));  // their one home
  for (HttpRoute& r : routes) core.routes[r.path].by_method[r.method] = std::move(r.handler);
  if (options.security.tls()) {
    if (auto st = SetUpTls(options.security, &core.tls); !st.ok()) return st;
  }
  RaiseOpenFileLimit();
  if (auto st = Listen(impl->acceptor, options.host, options.port); !st.ok()) return st;
  impl->port = impl->acceptor.local_endpoint().port();
  core.workers.emplace(std::max(1, options.worker_threads));
  const int io_threads = std::max(1, options.io_threads);
  core.options = std::move(options);
  impl->work.emplace(core.ioc.get_executor());
  impl->Accept();
  for (int i = 0; i < io_threads; ++i) impl->io_threads.emplace_back([&core] { core.ioc.run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }
int HttpServer::port() const { return impl_->port; }

void HttpServer::SetResponseHeader(const std::string& name, const std::string& value) {
  impl_->core.gate->Set(name, value);
}

void HttpServer::Stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  asio::post(m.acceptor.get_executor(), [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
    m.accept_backoff.cancel();
  });
  m.core.workers->join();  // running handlers finish (and may still answer)
  {
    std::lock_guard<std::mutex> l(m.core.gate->mu);
    m.core.gate->stopped = true;
  }
  std::vector<std::shared_ptr<SessionBase>> open;
  {
    std::lock_guard<std::mutex> l(m.core.sessions_mu);
    for (auto& [id, s] : m.core.sessions) open.push_back(s);
  }
  for (auto& s : open) s->Post([s] { s->CloseNow(); });
  open.clear();
  m.work.reset();
  // Everything left is closed and its handlers run with errors, after which run() returns; a
  // bounded wait covers anything that is not.
  for (int i = 0; i < 300 && !m.core.ioc.stopped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.core.ioc.stop();
  for (std::thread& t : m.io_threads) t.join();
  std::lock_guard<std::mutex> l(m.core.sessions_mu);
  m.core.sessions.clear();
}

}  // namespace specula
