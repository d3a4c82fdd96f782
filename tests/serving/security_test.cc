#include "serving/security.h"

#include <gtest/gtest.h>

namespace specula {
namespace {

TEST(BearerMatchesTest, AcceptsOnlyTheKeyAsABearerToken) {
  EXPECT_TRUE(BearerMatches("Bearer sk-123", "sk-123"));
  EXPECT_TRUE(BearerMatches("bearer sk-123", "sk-123"));  // the scheme is case-insensitive
  EXPECT_FALSE(BearerMatches("Bearer sk-124", "sk-123"));
  EXPECT_FALSE(BearerMatches("Bearer sk-12", "sk-123"));
  EXPECT_FALSE(BearerMatches("Bearer sk-1234", "sk-123"));
  EXPECT_FALSE(BearerMatches("Basic sk-123", "sk-123"));
  EXPECT_FALSE(BearerMatches("sk-123", "sk-123"));
  EXPECT_FALSE(BearerMatches("", "sk-123"));
  EXPECT_FALSE(BearerMatches("Bearer ", ""));  // no key configured never matches
}

TEST(SecurityOptionsTest, TlsFilesComeAsAReadablePair) {
  SecurityOptions s;
  EXPECT_TRUE(ValidateSecurityOptions(s).ok());
  s.ssl_certfile = "/etc/hostname";
  EXPECT_NE(ValidateSecurityOptions(s).message().find("--ssl-keyfile"), std::string::npos);
  s.ssl_keyfile = "/nonexistent/key.pem";
  EXPECT_NE(ValidateSecurityOptions(s).message().find("--ssl-keyfile: cannot read /nonexistent/key.pem"),
            std::string::npos);
  s = {};
  s.ssl_ca_certs = "/etc/hostname";
  EXPECT_NE(ValidateSecurityOptions(s).message().find("--ssl-ca-certs"), std::string::npos);
}

}  // namespace
}  // namespace specula
