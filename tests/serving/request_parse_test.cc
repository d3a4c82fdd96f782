// Request parsing in the front ends, as the fuzz targets drive it (fuzz/http_request_fuzz.cc,
// fuzz/grpc_request_fuzz.cc): a body or message becomes a ServeRequest, or an error naming the
// field, never an exception; then the server's checks (NormalizeRequest).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chat/chat.h"
#include "chat/chat_template.h"
#include "gtest/gtest.h"
#include "request/boundary.h"
#include "request/finish.h"
#include "serving/grpc_frontend.h"
#include "specula/v1/generation.pb.h"
#include "serving/openai_api.h"
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

// A field that would change the output and is not implemented is refused by name (a 400), never
// ignored; its neutral values pass. Roles are OpenAI's.
TEST_F(HttpBodyTest, UnimplementedFieldsAndUnknownRolesAreRefusedByName) {
  for (const char* field : {R"("tools": [{"type": "function"}])", R"("tool_choice": "required")",
                            R"("guided_decoding_backend": "outlines")", R"("suffix": "end")"}) {
    auto c = Parse(absl::StrCat(R"({"prompt": "hi", )", field, "}"), false);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << field;
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    EXPECT_EQ(c.status().message().rfind(name + ":", 0), 0u) << c.status();
  }
  auto neutral = Parse(R"({"prompt": "hi", "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {},
                           "tools": [], "tool_choice": "none", "response_format": {"type": "text"}})", false);
  EXPECT_TRUE(neutral.ok()) << neutral.status();
  auto echo = Parse(R"({"messages": [{"role": "user", "content": "hi"}], "echo": true})", true);
  EXPECT_EQ(echo.status().message().rfind("echo:", 0), 0u) << echo.status();
  auto robot = Parse(R"({"messages": [{"role": "robot", "content": "hi"}]})", true);
  ASSERT_FALSE(robot.ok());
  EXPECT_NE(robot.status().message().find("messages[0].role: 'robot'"), std::string::npos) << robot.status();
  for (const char* role : {"system", "developer", "user", "assistant", "tool"}) {
    EXPECT_TRUE(Parse(absl::StrCat(R"({"messages": [{"role": ")", role, R"(", "content": "hi"}]})"), true).ok()) << role;
  }
}

// Structured output: each field of OpenAI, vLLM and llama.cpp becomes the one constraint, a schema
// keeps its properties' order, and two sources at once are refused naming the second.
TEST_F(HttpBodyTest, ConstraintFieldsBecomeOneConstraint) {
  using Kind = ConstraintSpec::Kind;
  struct Case {
    const char* body;
    Kind kind;
    const char* text;
  };
  for (const Case& c : {Case{R"("response_format": {"type": "json_object"})", Kind::kJsonObject, ""},
                        Case{R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
                             "schema": {"type": "object", "properties": {"z": {}, "a": {}}}}})",
                             Kind::kJsonSchema, R"({"type":"object","properties":{"z":{},"a":{}}})"},
                        Case{R"("guided_json": "{\"type\": \"integer\"}")", Kind::kJsonSchema, R"({"type":"integer"})"},
                        Case{R"("json_schema": {"type": "string"})", Kind::kJsonSchema, R"({"type":"string"})"},
                        Case{R"("guided_regex": "a+")", Kind::kRegex, "a+"},
                        Case{R"("structured_outputs": {"regex": "b+"})", Kind::kRegex, "b+"},
                        Case{R"("grammar": "root ::= \"x\"")", Kind::kGrammar, R"(root ::= "x")"},
                        Case{R"("structured_outputs": {"grammar": "root ::= \"y\""})", Kind::kGrammar, R"(root ::= "y")"},
                        Case{R"("guided_choice": ["a", "b"])", Kind::kChoice, ""},
                        Case{R"("response_format": {"type": "text"})", Kind::kNone, ""}}) {
    auto b = Parse(absl::StrCat(R"({"prompt": "hi", )", c.body, "}"), false);
    ASSERT_TRUE(b.ok()) << c.body << ": " << b.status();
    EXPECT_EQ(b->request.constraint.kind, c.kind) << c.body;
    EXPECT_EQ(b->request.constraint.text, c.text) << c.body;
  }
  auto two = Parse(R"({"prompt": "hi", "response_format": {"type": "json_object"}, "guided_regex": "a"})", false);
  EXPECT_EQ(two.status().message().rfind("guided_regex: cannot be combined with response_format", 0), 0u) << two.status();
  auto bad_type = Parse(R"({"prompt": "hi", "response_format": {"type": "xml"}})", false);
  EXPECT_EQ(bad_type.status().message().rfind("response_format.type:", 0), 0u) << bad_type.status();
  auto unknown = Parse(R"({"prompt": "hi", "structured_outputs": {"json": {}, "whitespace_pattern": " "}})", false);
  EXPECT_EQ(unknown.status().message().rfind("structured_outputs.whitespace_pattern:", 0), 0u) << unknown.status();
  // vLLM's disable_any_whitespace: compact JSON, for the JSON kinds only.
  auto compact = Parse(R"({"prompt": "hi", "structured_outputs": {"json": {}, "disable_any_whitespace": true}})", false);
  ASSERT_TRUE(compact.ok()) << compact.status();
  EXPECT_TRUE(compact->request.constraint.compact_json);
  auto loose = Parse(R"({"prompt": "hi", "structured_outputs": {"disable_any_whitespace": false, "json": {}}})", false);
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_FALSE(loose->request.constraint.compact_json);
  for (const char* body : {R"({"prompt": "hi", "structured_outputs": {"regex": "a", "disable_any_whitespace": true}})",
                           R"({"prompt": "hi", "structured_outputs": {"disable_any_whitespace": true}})",
                           R"({"prompt": "hi", "structured_outputs": {"json": {}, "disable_any_whitespace": 1}})"}) {
    auto refused = Parse(body, false);
    EXPECT_EQ(refused.status().message().rfind("structured_outputs.disable_any_whitespace:", 0), 0u)
        << body << ": " << refused.status();
  }
}

// Logprobs, samples, echo, penalties and biases: parsed into the request, bad values refused by name.
TEST_F(HttpBodyTest, LogprobsSamplesPenaltiesAndBiases) {
  auto c = Parse(R"({"prompt": "hi", "logprobs": 3, "echo": true, "n": 2, "best_of": 5, "frequency_penalty": 0.5,
                     "presence_penalty": -1, "logit_bias": {"7": -100, "12": 2.5}})", false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->logprobs, 3);
  EXPECT_EQ(c->request.logprobs, 3);
  EXPECT_EQ(c->request.prompt_logprobs, 3);  // echo with logprobs scores the prompt too
  EXPECT_TRUE(c->echo);
  EXPECT_EQ(c->n, 2);
  EXPECT_EQ(c->request.n, 5);  // best_of samples are drawn
  EXPECT_FLOAT_EQ(c->request.sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(c->request.sampling.presence_penalty, -1.0f);
  ASSERT_EQ(c->request.sampling.logit_bias.size(), 2u);
  auto bias = c->request.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<TokenId, float>>{{7, -100.0f}, {12, 2.5f}}));
  auto best = Parse(R"({"prompt": "hi", "best_of": 3})", false);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->logprobs, -1);          // not shown ...
  EXPECT_EQ(best->request.logprobs, 0);   // ... but computed, to rank the samples
  auto chat = Parse(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 4})", true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->request.logprobs, 4);
  EXPECT_EQ(chat->request.prompt_logprobs, -1);
  auto chat_off = Parse(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": false})", true);
  ASSERT_TRUE(chat_off.ok()) << chat_off.status();
  EXPECT_EQ(chat_off->request.logprobs, -1);
  struct BadCase {
    const char* body;
    bool chat;
    const char* field;
  };
  for (const BadCase& b : {BadCase{R"("logprobs": 21)", false, "logprobs:"}, {R"("logprobs": true)", false, "logprobs:"},
                           {R"("top_logprobs": 2)", false, "top_logprobs:"}, {R"("n": 0)", false, "n:"},
                           {R"("n": 3, "best_of": 2)", false, "best_of:"},
                           {R"("best_of": 2, "stream": true)", false, "best_of:"},
                           {R"("logit_bias": {"x": 1})", false, "logit_bias:"},
                           {R"("logit_bias": [1])", false, "logit_bias:"},
                           {R"("frequency_penalty": "high")", false, "frequency_penalty:"},
                           {R"("top_logprobs": 2)", true, "top_logprobs:"},
                           {R"("logprobs": true, "top_logprobs": 30)", true, "top_logprobs:"},
                           {R"("logprobs": 1)", true, "logprobs:"}, {R"("best_of": 2)", true, "best_of:"}}) {
    const std::string body = b.chat ? absl::StrCat(R"({"messages": [{"role": "user", "content": "hi"}], )", b.body, "}")
                                    : absl::StrCat(R"({"prompt": "hi", )", b.body, "}");
    auto r = Parse(body, b.chat);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().message().rfind(b.field, 0), 0u) << body << " -> " << r.status();
  }
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// vLLM's cache_salt: a non-empty string on both routes (null: none), a proto3 string on gRPC (empty:
// none); the spec carries it, and Generate's samples copy the spec.
TEST_F(HttpBodyTest, CacheSaltIsANonEmptyString) {
  for (bool chat : {false, true}) {
    const std::string prompt = chat ? R"("messages": [{"role": "user", "content": "a"}])" : R"("prompt": "a")";
    auto given = Parse(absl::StrCat("{", prompt, R"(, "cache_salt": "tenant-7", "n": 2})"), chat);
    ASSERT_TRUE(given.ok()) << given.status();
    EXPECT_EQ(given->request.cache_salt, "tenant-7");
    for (const char* absent : {"", R"(, "cache_salt": null)"}) {
      auto none = Parse(absl::StrCat("{", prompt, absent, "}"), chat);
      ASSERT_TRUE(none.ok()) << none.status();
      EXPECT_EQ(none->request.cache_salt, "");
    }
    for (const char* bad : {R"("")", "7", R"(["a"])", R"({"s": 1})", "true"}) {
      auto refused = Parse(absl::StrCat("{", prompt, R"(, "cache_salt": )", bad, "}"), chat);
      ASSERT_FALSE(refused.ok()) << bad;
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(refused.status().message().rfind("cache_salt: ", 0), 0u) << refused.status();
    }
  }
  v1::GenerateRequest g;
  g.set_prompt("a");
  auto none = ParseGenerateRequest(g.SerializeAsString());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->cache_salt, "");
  g.set_cache_salt("tenant-7");
  auto salted = ParseGenerateRequest(g.SerializeAsString());
  ASSERT_TRUE(salted.ok()) << salted.status();
  EXPECT_EQ(salted->cache_salt, "tenant-7");
}

// The server's own checks (the request boundary under the request's row): the ranges of the new
// fields, by name, and a text prompt too long to fit the context refused from its length, before
// tokenizing.
TEST(ServeRequestBoundaryTest, RangesAndPromptBytes) {
  auto tok = LoadTokenizer(testing::TinyStoriesDir() + "/tok512.bin", 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto check = [&](const ServeRequest& r, size_t max_bytes = SIZE_MAX) {
    RequestSpec spec = r;
    return NormalizeRequest(r.surface, ServeRequestContext(**tok, 512, 256, true, kMaxTokensFlagDefault, max_bytes), ServePrompt(r),
                            &spec)
        .status();
  };
  ServeRequest r;
  r.prompt = "Lily went to the park";
  ASSERT_TRUE(check(r).ok());
  for (auto [field, set] : std::vector<std::pair<std::string, std::function<void(ServeRequest&)>>>{
           {"logprobs", [](ServeRequest& q) { q.logprobs = 21; }},
           {"prompt_logprobs", [](ServeRequest& q) { q.prompt_logprobs = 100; }},
           {"n", [](ServeRequest& q) { q.n = 0; }},
           {"logit_bias", [](ServeRequest& q) { q.sampling.logit_bias = {{512, 1.0f}}; }},
           {"frequency_penalty", [](ServeRequest& q) { q.sampling.frequency_penalty = 2.5f; }},
           {"logit_bias[3]", [](ServeRequest& q) { q.sampling.logit_bias = {{3, 101.0f}}; }},
           {"cache_salt", [](ServeRequest& q) { q.cache_salt.assign(kMaxCacheSaltBytes + 1, 's'); }}}) {
    ServeRequest bad = r;
    set(bad);
    const absl::Status st = check(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(st.message().rfind(field, 0), 0u) << field << ": " << st;
  }
  ServeRequest longest = r;
  longest.cache_salt.assign(kMaxCacheSaltBytes, 's');
  EXPECT_TRUE(check(longest).ok());
  const size_t limit = MaxPromptBytes(**tok, 256);
  EXPECT_GE(limit, 2u * 256);
  ServeRequest huge = r;
  huge.prompt = std::string(limit + 1, 'a');
  const absl::Status st = check(huge, limit);
  EXPECT_NE(st.message().find("cannot fit the context"), std::string::npos) << st;
  huge.prompt.resize(limit);  // within the byte bound: tokenized, then refused by its token count
  EXPECT_NE(check(huge, limit).message().find("leave no room"), std::string::npos);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// The gRPC front end maps each finish reason by the table's name (request/finish.h): every name is
// a value of specula.v1.FinishReason, and the values are the ones the proto documents.
TEST(FinishNamesTest, GrpcNamesAreTheProtoValues) {
  const std::pair<FinishReason, v1::FinishReason> want[] = {
      {FinishReason::kNone, v1::FINISH_REASON_UNSPECIFIED},  {FinishReason::kStopToken, v1::FINISH_REASON_STOP},
      {FinishReason::kStopString, v1::FINISH_REASON_STOP},   {FinishReason::kMaxTokens, v1::FINISH_REASON_LENGTH},
      {FinishReason::kAborted, v1::FINISH_REASON_ABORTED},   {FinishReason::kError, v1::FINISH_REASON_UNSPECIFIED}};
  for (auto [reason, value] : want) {
    v1::FinishReason parsed;
    ASSERT_TRUE(v1::FinishReason_Parse(GrpcFinishName(reason), &parsed)) << GrpcFinishName(reason);
    EXPECT_EQ(parsed, value) << FinishName(reason);
  }
}

}  // namespace
}  // namespace specula
