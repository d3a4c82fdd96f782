// Request parsing in the front ends, as the fuzz targets drive it (fuzz/http_request_fuzz.cc,
// fuzz/grpc_request_fuzz.cc): a body or message becomes a ServeRequest, or an error naming the
// field, never an exception; then the server's validation.
#include <string>

#include "chat/chat.h"
#include "chat/chat_template.h"
#include "gtest/gtest.h"
#include "serving/grpc_frontend.h"
#include "serving/http_frontend.h"
#include "serving/server.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

class HttpBodyTest : public ::testing::Test {
 protected:
  absl::StatusOr<HttpRequestBody> Parse(const std::string& body, bool chat) {
    return ParseHttpRequestBody(body, chat, "m", &*chat_template_, chat_source_);
  }
  absl::StatusOr<ChatSource> chat_source_ = ChatSource{"{% for m in messages %}{{ m.content }}{% endfor %}", "<s>", "</s>", "t"};
  absl::StatusOr<ChatTemplate> chat_template_ = ChatTemplate::Parse(chat_source_->template_text);
};

TEST_F(HttpBodyTest, CompletionAndChatBodies) {
  auto c = Parse(R"({"model": "m", "prompt": "hi", "max_tokens": 3, "stream": true,
                     "stream_options": {"include_usage": true}, "stop": ["x"]})", false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->request.prompt, "hi");
  EXPECT_EQ(c->request.max_tokens, 3);
  EXPECT_TRUE(c->stream);
  EXPECT_TRUE(c->usage_in_stream);
  auto m = Parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})", true);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->request.prompt, "ab");
  EXPECT_TRUE(m->request.templated);
  EXPECT_EQ(Parse(R"({"model": "other", "prompt": "hi"})", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Parse("[1]", false).status().code(), absl::StatusCode::kInvalidArgument);
}

// Found by review while writing fuzz/http_request_fuzz, reproduced with it: nlohmann's value()
// throws when the field has another type than its default, so these bodies ended in an exception (a
// 500 from httplib's handler, a crash in the fuzz target) instead of a request or a 400 naming the
// field.
TEST_F(HttpBodyTest, FieldsOfAnotherTypeAreNotExceptions) {
  auto c = Parse(R"({"prompt": "hi", "stream": true, "stream_options": {"include_usage": "yes"}})", false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->usage_in_stream);  // as "stream": "yes" is not streaming
  auto m = Parse(R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "a"}]}]})", true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("messages[0].content"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace specula
