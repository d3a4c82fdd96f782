// HttpServer over TLS: a throwaway self-signed certificate (the openssl CLI) serves as the server's
// certificate and, for client certificates, as the CA and the client's certificate.
#include <utility>  // before Boost 1.74's Asio, which uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "serving/http_server.h"

namespace specula {
namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

struct Pem {
  std::string cert, key;
};

const Pem& SelfSigned() {
  static const Pem pem = [] {
    const std::string dir = std::filesystem::temp_directory_path() / ("specula_tls_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    Pem p{dir + "/cert.pem", dir + "/key.pem"};
    const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout " + p.key +
                            " -out " + p.cert + " >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return p;
  }();
  return pem;
}

std::unique_ptr<HttpServer> StartTls(bool client_certs) {
  HttpServerOptions o;
  o.security.ssl_certfile = SelfSigned().cert;
  o.security.ssl_keyfile = SelfSigned().key;
  if (client_certs) o.security.ssl_ca_certs = SelfSigned().cert;
  auto s = HttpServer::Start(o, {{"GET", "/hello", [](HttpRequest, std::shared_ptr<HttpExchange> ex) {
                                    ex->Respond(200, "text/plain", "over tls");
                                  }}});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// One GET /hello over TLS; the response's text, or the error's.
std::string TlsGet(int port, bool with_client_cert) {
  asio::io_context ioc;
  ssl::context ctx(ssl::context::tls_client);
  ctx.load_verify_file(SelfSigned().cert);
  ctx.set_verify_mode(ssl::verify_peer);
  if (with_client_cert) {
    ctx.use_certificate_chain_file(SelfSigned().cert);
    ctx.use_private_key_file(SelfSigned().key, ssl::context::pem);
  }
  ssl::stream<tcp::socket> s(ioc, ctx);
  boost::system::error_code ec;
  s.next_layer().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)), ec);
  if (!ec) s.handshake(ssl::stream_base::client, ec);
  const std::string req = "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (!ec) asio::write(s, asio::buffer(req), ec);
  std::string out;
  while (!ec) {
    char buf[4096];
    const size_t n = s.read_some(asio::buffer(buf), ec);
    out.append(buf, n);
  }
  return out.empty() ? "error: " + ec.message() : out;
}

TEST(HttpServerTls, RoundTrip) {
  auto server = StartTls(false);
  ASSERT_NE(server, nullptr);
  const std::string r = TlsGet(server->port(), false);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("over tls"), std::string::npos) << r;
}

TEST(HttpServerTls, PlaintextToATlsPortGetsNoAnswer) {
  auto server = StartTls(false);
  ASSERT_NE(server, nullptr);
  asio::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(server->port())));
  asio::write(s, asio::buffer(std::string("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string out;
  boost::system::error_code ec;
  while (!ec) {
    char buf[4096];
    const size_t n = s.read_some(asio::buffer(buf), ec);
    out.append(buf, n);
  }
  EXPECT_EQ(out.find("HTTP/1.1 200"), std::string::npos) << out;
}

TEST(HttpServerTls, CaCertsRequireAClientCertificate) {
  auto server = StartTls(true);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(TlsGet(server->port(), false).rfind("HTTP/1.1 200", 0), std::string::npos);
  const std::string r = TlsGet(server->port(), true);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
}

TEST(HttpServerTls, AMissingCertificateFileIsNamed) {
  HttpServerOptions o;
  o.security.ssl_certfile = "/nonexistent/cert.pem";
  o.security.ssl_keyfile = SelfSigned().key;
  auto s = HttpServer::Start(o, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--ssl-certfile /nonexistent/cert.pem"), std::string_view::npos) << s.status();
}

}  // namespace
}  // namespace specula
