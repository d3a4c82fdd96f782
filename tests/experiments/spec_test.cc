// Experiment specs: parse errors and validation errors carry the spec's file, line and column;
// the sweep expands each meaningful combination once; results.jsonl's done set survives a torn line.
#include "experiments/spec.h"

#include <fstream>
#include <set>
#include <string>

#include "experiments/harness.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula::experiments {
namespace {

const std::string kModels = SPECULA_TEST_MODELS;

class SpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory per test: ctest runs these in parallel, and one shared prompts file, truncated by a
    // test's SetUp while another test read it, gave the wrong error (CI at c312f27).
    dir_ = testing::MakeTempDir();
    std::ofstream(dir_ + "/prompts.jsonl") << "{\"prompt\": \"Once upon a time\"}\n{\"prompt\": \"The cat\"}\n";
    std::ofstream(dir_ + "/bad.jsonl") << "{\"prompt\": \"ok\"}\n{\"prompt\": 7}\n";
  }
  // A valid spec's lines 1-4, then `rest` from line 5.
  std::string Spec(const std::string& rest) const {
    return "name: \"t\"\n"
           "model { path: \"" + kModels + "/stories260K.bin\" tokenizer: \"" + kModels + "/tok512.bin\" }\n"
           "draft { path: \"" + kModels + "/stories260K-draft.bin\" }\n"
           "workload { prompts_file: \"prompts.jsonl\" num_requests: 8 max_tokens: 16 seed: 3 }\n" + rest;
  }
  absl::StatusOr<LoadedSpec> Parse(const std::string& text) const { return ParseSpec(dir_ + "/spec.textproto", text); }
  // The error's "file:line:col: " prefix and that it mentions `what`.
  void ExpectError(const std::string& text, int line, int col, const std::string& what) const {
    auto s = Parse(text);
    ASSERT_FALSE(s.ok()) << text;
    const std::string msg(s.status().message());
    EXPECT_EQ(msg.rfind(dir_ + "/spec.textproto:" + std::to_string(line) + ":" + std::to_string(col) + ": ", 0), 0u)
        << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
  std::string dir_;
};

TEST_F(SpecTest, TheIssuesSpecParsesWithItsDefaults) {
  auto s = Parse(Spec("mode: OFFLINE\nsweep {\n  max_num_seqs: [1, 8, 32]\n  spec_method: [\"none\", \"draft\", \"ngram\"]\n"
                      "  num_spec_tokens: [1, 2, 4, 0]   # 0 = auto\n  temperature: [0.0, 0.8]\n}\nrepeats: 2\n"
                      "slo { ttft_ms: 500 tpot_ms: 50 }\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->spec.repeats(), 2);
  EXPECT_EQ(s->spec.workload().prompts_file(), dir_ + "/prompts.jsonl");  // relative to the spec
  EXPECT_EQ(s->spec.max_spec_tokens(), 8);
  const std::vector<Point> points = ExpandSweep(s->spec);
  // none once per (seqs, T); draft and ngram with each k: 3 x 2 x (1 + 4 + 4).
  EXPECT_EQ(points.size(), 54u);
  int none = 0;
  for (const Point& p : points) none += p.spec_method == "none";
  EXPECT_EQ(none, 6);
  std::set<std::string> keys;
  for (const Point& p : points) keys.insert(p.Key());
  EXPECT_EQ(keys.size(), points.size());
}

// The suffix decoding example (experiments/specs/suffix-faq.textproto): none once, n-gram and suffix
// at k = 4 and auto, each from its own engine.
TEST_F(SpecTest, TheSuffixFaqSpecParses) {
  auto s = LoadSpec(std::string(SPECULA_SOURCE_DIR) + "/experiments/specs/suffix-faq.textproto");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->spec.workload().num_requests(), 44);
  std::multiset<std::string> methods;
  for (const Point& p : ExpandSweep(s->spec)) methods.insert(p.spec_method);
  EXPECT_EQ(methods, (std::multiset<std::string>{"none", "ngram", "ngram", "suffix", "suffix"}));
}

TEST_F(SpecTest, CommentsAndLayoutDoNotChangeTheHashButValuesDo) {
  auto a = Parse(Spec("sweep { max_num_seqs: [1, 8] }\n"));
  auto b = Parse(Spec("# a comment\nsweep {\n  max_num_seqs: 1\n  max_num_seqs: 8\n}\nrepeats: 1\n"));
  auto c = Parse(Spec("sweep { max_num_seqs: [1, 16] }\n"));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->hash, b->hash);
  EXPECT_NE(a->hash, c->hash);
}

TEST_F(SpecTest, OnlineWithAnEndpointVariesOnlyTheClient) {
  auto s = Parse(Spec("mode: ONLINE\nendpoint: \"grpc://127.0.0.1:1\"\nsweep { request_rate: [1, 2] temperature: [0, 1] }\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<Point> points = ExpandSweep(s->spec);
  ASSERT_EQ(points.size(), 4u);
  EXPECT_TRUE(points[0].remote);
  EXPECT_EQ(points[0].Key(), "temperature=0,request_rate=1,burstiness=1");
  EXPECT_TRUE(points[0].Json()["max_num_seqs"].is_null());
}

// Ten malformed specs (and a few more), each with its line and column.
TEST_F(SpecTest, ParserErrorsNameLineAndColumn) {
  // Where the text parser reports them: after the token it could not take.
  ExpectError(Spec("modell { path: \"x\" }\n"), 5, 8, "no field named \"modell\"");
  ExpectError(Spec("sweep { max_num_seqs: [1, 8 }\n"), 5, 29, "");
  ExpectError(Spec("repeats: \"two\"\n"), 5, 10, "Expected integer");
  ExpectError(Spec("mode: SOMETIMES\n"), 6, 1, "Unknown enumeration value of \"SOMETIMES\"");
  ExpectError(Spec("sweep {\n  max_num_seqs: 3000000000\n}\n"), 6, 17, "Integer out of range");
}

TEST_F(SpecTest, ValidationErrorsNameLineAndColumn) {
  ExpectError(Spec("sweep {\n  max_num_seqs: [1, -8]\n}\n"), 6, 21, "sweep.max_num_seqs[1]: -8 is not in [1, 1024]");
  ExpectError(Spec("sweep { spec_method: [\"none\", \"eagle\"] }\n"), 5, 31, "sweep.spec_method[1]: \"eagle\" is not one of");
  ExpectError(Spec("sweep { temperature: [-1] }\n"), 5, 23, "sweep.temperature[0]: -1 is not in [0, 100]");
  ExpectError(Spec("sweep { num_spec_tokens: [4, 4] }\n"), 5, 30, "sweep.num_spec_tokens[1]: 4 is listed twice");
  ExpectError(Spec("max_spec_tokens: 4\nsweep { num_spec_tokens: [2, 6] }\n"), 6, 30, "is above max_spec_tokens (4)");
  ExpectError(Spec("mode: ONLINE\nsweep { max_num_seqs: [8] }\n"), 6, 1, "mode: ONLINE needs sweep.request_rate");
  ExpectError(Spec("sweep { request_rate: [4] }\n"), 5, 9, "sweep.request_rate applies to mode: ONLINE only");
  ExpectError(Spec("mode: ONLINE\nendpoint: \"grpc://h:1\"\nsweep { request_rate: [4] max_num_seqs: [8] }\n"), 7, 27,
              "sweep.max_num_seqs: the server at endpoint fixes it");
    // Single values point at their field's name.
  ExpectError(Spec("mode: ONLINE\nendpoint: \"tcp://h:1\"\nsweep { request_rate: [4] }\n"), 6, 1, "is not grpc://");
  ExpectError(Spec("repeats: -2\n"), 5, 1, "repeats: -2");
  ExpectError(Spec("slo {\n  ttft_ms: -5\n}\n"), 6, 3, "slo.ttft_ms");
}

// Bursts and traces: sweep.burst_factor, the window and record_trace, each refused by name.
TEST_F(SpecTest, BurstAndTraceErrorsNameTheirField) {
  const std::string online = "mode: ONLINE\n";
  ExpectError(Spec(online + "sweep { request_rate: [4] burst_factor: [0] }\n"), 6, 42,
              "sweep.burst_factor[0]: 0 is not in [0.001, 1000]");
  ExpectError(Spec(online + "sweep { request_rate: [4] burst_factor: [2, nan] }\n"), 6, 45, "sweep.burst_factor[1]: nan");
  ExpectError(Spec("sweep { burst_factor: [1, 5] }\n"), 5, 27, "sweep.burst_factor[1]: 5 needs mode: ONLINE");
  ExpectError(Spec(online + "sweep { request_rate: [4] burst_factor: [5] }\n"), 6, 42,
              "sweep.burst_factor[0]: 5 needs a burst window: burst_duration_s > 0");
  ExpectError(Spec(online + "burst_duration_s: 2\nsweep { request_rate: [4, inf] burst_factor: [5] }\n"), 7, 27,
              "sweep.request_rate[1]: inf: sweep.burst_factor[0]: 5 needs finite rates");
  ExpectError(Spec(online + "burst_start_s: -1\nsweep { request_rate: [4] }\n"), 6, 1, "burst_start_s: -1 is not a time >= 0");
  ExpectError(Spec(online + "burst_duration_s: inf\nsweep { request_rate: [4] }\n"), 6, 1,
              "burst_duration_s: inf is not a time >= 0");
  ExpectError(Spec(online + "burst_duration_s: 2\nsweep { request_rate: [4] burst_factor: [1] }\n"), 6, 1,
              "burst_duration_s: the burst window needs sweep.burst_factor with a value other than 1");
  ExpectError(Spec("sweep { max_num_seqs: [8] }\nrecord_trace: true\n"), 6, 1, "record_trace needs mode: ONLINE");
  // No burst is no error: OFFLINE with burst_factor [1] runs as without it.
  EXPECT_TRUE(Parse(Spec("sweep { burst_factor: [1] }\n")).ok());
}

// A burst sweep against an endpoint: burst_factor 1 keeps the key it had without bursts, and every
// point records the window, so that its arrivals replay.
TEST_F(SpecTest, BurstFactorIsASweepDimensionWithTheWindowInEveryPoint) {
  auto s = Parse(Spec("mode: ONLINE\nendpoint: \"http://127.0.0.1:1\"\nburst_start_s: 1.5\nburst_duration_s: 2\n"
                      "record_trace: true\nsweep { request_rate: [4] burst_factor: [1, 5] }\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<Point> points = ExpandSweep(s->spec);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].Key(), "temperature=0,request_rate=4,burstiness=1");
  EXPECT_EQ(points[1].Key(), "temperature=0,request_rate=4,burstiness=1,burst_factor=5");
  const nlohmann::json j = points[1].Json();
  EXPECT_EQ(j["burst_factor"], 5.0);
  EXPECT_EQ(j["burst_start_s"], 1.5);
  EXPECT_EQ(j["burst_duration_s"], 2.0);
  EXPECT_EQ(points[0].Json()["burst_factor"], 1.0);
  auto offline = Parse(Spec("sweep { max_num_seqs: [8] }\n"));
  ASSERT_TRUE(offline.ok());
  EXPECT_TRUE(ExpandSweep(offline->spec)[0].Json()["burst_factor"].is_null());
}

// The example spec: ONLINE, a rate sweep with and without a burst, traces recorded.
TEST_F(SpecTest, TheOnlineBurstsSpecParses) {
  auto s = LoadSpec(std::string(SPECULA_SOURCE_DIR) + "/experiments/specs/online-bursts.textproto");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->spec.record_trace());
  std::set<double> factors;
  for (const Point& p : ExpandSweep(s->spec)) factors.insert(*p.burst_factor);
  EXPECT_EQ(factors, (std::set<double>{1, 5}));
}

// A conversation workload: ONLINE and closed loop, so its points have no arrival parameters; its
// defaults fill in, its run sends sessions * turns requests, and its user messages are read once.
TEST_F(SpecTest, AConversationWorkloadParsesWithItsDefaults) {
  std::ofstream(dir_ + "/users.jsonl") << "\"hello\"\n{\"content\": \"tell me more\"}\n";
  auto s = Parse(Spec("").substr(0, Spec("").find("workload")) +
                 "workload { conversation { sessions: 3 turns: 2 user_messages_file: \"users.jsonl\" } max_tokens: 8 }\n"
                 "mode: ONLINE\nsweep { temperature: [0, 0.5] }\nrecord_trace: true\n");
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::Conversation& c = s->spec.workload().conversation();
  EXPECT_EQ(s->spec.workload().num_requests(), 6);
  EXPECT_EQ(c.turn_routing(), "session");
  EXPECT_EQ(c.user_words(), 0);  // the file's messages, not synthetic ones
  EXPECT_EQ(c.user_messages_file(), dir_ + "/users.jsonl");
  EXPECT_EQ(s->user_messages, (std::vector<std::string>{"hello", "tell me more"}));
  const std::vector<Point> points = ExpandSweep(s->spec);
  ASSERT_EQ(points.size(), 2u);
  for (const Point& p : points) {
    EXPECT_TRUE(p.online);
    EXPECT_FALSE(p.request_rate.has_value());
    EXPECT_FALSE(p.burstiness.has_value());
    EXPECT_EQ(p.Key().find("request_rate"), std::string::npos) << p.Key();
    EXPECT_TRUE(p.Json()["request_rate"].is_null());
  }
  auto d = Parse(Spec("").substr(0, Spec("").find("workload")) +
                 "workload { conversation {} }\nmode: ONLINE\nendpoint: \"http://127.0.0.1:1,grpc://127.0.0.1:2\"\n");
  ASSERT_TRUE(d.ok()) << d.status();
  const ConversationOptions defaults;
  EXPECT_EQ(d->spec.workload().conversation().sessions(), defaults.num_sessions);
  EXPECT_EQ(d->spec.workload().conversation().turns(), defaults.turns);
  EXPECT_EQ(d->spec.workload().conversation().user_words(), defaults.user_words);
  EXPECT_EQ(d->spec.workload().num_requests(), defaults.num_sessions * defaults.turns);
  EXPECT_EQ(ExpandSweep(d->spec).size(), 1u);
  auto example = LoadSpec(std::string(SPECULA_SOURCE_DIR) + "/experiments/specs/multi-turn.textproto");
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_EQ(example->spec.workload().num_requests(), 32);
}

// A conversation's errors, each at its field: OFFLINE, an arrival sweep, num_requests, the bounds,
// the routing, the user messages, and endpoint lists.
TEST_F(SpecTest, ConversationErrorsNameTheirField) {
  const std::string head = Spec("").substr(0, Spec("").find("workload"));  // lines 1-3
  auto conv = [&](const std::string& fields, const std::string& rest) {
    return head + "workload { conversation { " + fields + " } }\n" + rest;
  };
  auto col = [](const std::string& line, const std::string& at) { return static_cast<int>(line.find(at)) + 1; };
  ExpectError(conv("", "mode: OFFLINE\n"), 4, col("workload { conversation", "conversation"),
              "workload.conversation needs mode: ONLINE");
  ExpectError(conv("", "mode: ONLINE\nsweep { request_rate: [4] }\n"), 6, 9,
              "sweep.request_rate: a conversation is closed loop");
  ExpectError(conv("", "mode: ONLINE\nsweep { burst_factor: [2] }\n"), 6, 9, "sweep.burst_factor: a conversation");
  const std::string requests = "workload { conversation {} num_requests: 5 }";
  ExpectError(head + requests + "\nmode: ONLINE\n", 4, col(requests, "num_requests"),
              "workload.num_requests: a conversation sends sessions * turns requests");
  const std::string turns = "workload { conversation { turns: -1 } }";
  ExpectError(conv("turns: -1", "mode: ONLINE\n"), 4, col(turns, "turns"),
              "workload.conversation.turns: -1 is not in [0, 10000]");
  ExpectError(conv("think_time_s: nan", "mode: ONLINE\n"), 4, 27, "workload.conversation.think_time_s: nan");
  ExpectError(conv("sessions: 1000 turns: 10000", "mode: ONLINE\n"), 4, 12, "sessions * turns is over 1000000");
  ExpectError(conv("turn_routing: \"bogus\"", "mode: ONLINE\n"), 4, 27,
              "workload.conversation.turn_routing: \"bogus\" is not session or rotate");
  ExpectError(conv("user_messages_file: \"bad.jsonl\"", "mode: ONLINE\n"), 4, 27,
              "workload.conversation.user_messages_file: " + dir_ + "/bad.jsonl:2: not a user message");
  const std::string words = "workload { conversation { user_messages_file: \"prompts.jsonl\" user_words: 4 } }";
  ExpectError(conv("user_messages_file: \"prompts.jsonl\" user_words: 4", "mode: ONLINE\n"), 4, col(words, "user_words"),
              "user_words is for synthetic user messages");
  ExpectError(Spec("mode: ONLINE\nendpoint: \"http://a:1,http://b:2\"\nsweep { request_rate: [4] }\n"), 6, 1,
              "endpoint: a list of endpoints needs workload.conversation");
  ExpectError(conv("", "mode: ONLINE\nendpoint: \"http://a:1,tcp://b:2\"\n"), 6, 1, "endpoint: \"tcp://b:2\" is not grpc://");
}

TEST_F(SpecTest, TraceFileNamesAreSafeAndDeterministic) {
  EXPECT_EQ(TraceFileName("temperature=0,request_rate=4,burstiness=1", 2), "temperature=0,request_rate=4,burstiness=1-r2.jsonl");
  EXPECT_EQ(TraceFileName("a/b c", 0), "a_b_c-r0.jsonl");
  EXPECT_EQ(TraceFileName("..", 0), "_..-r0.jsonl");
  // An in-process key is used as it is.
  auto s = Parse(Spec("mode: ONLINE\nsweep { max_num_seqs: [1024] temperature: [0.75] request_rate: [12.5] "
                      "burstiness: [0.5] burst_factor: [2.5] }\nburst_duration_s: 1\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string key = ExpandSweep(s->spec)[0].Key();
  EXPECT_EQ(TraceFileName(key, 0), key + "-r0.jsonl");
  const std::string long_key(300, 'k');
  const std::string name = TraceFileName(long_key, 1);
  EXPECT_LE(name.size(), 220u);
  EXPECT_EQ(name, TraceFileName(long_key, 1));
  EXPECT_NE(name, TraceFileName(long_key + "x", 1));  // the hash tells keys with one head apart
}

TEST_F(SpecTest, ADraftMethodWithoutADraftModelNamesTheField) {
  const std::string no_draft = "model { path: \"" + kModels + "/stories260K.bin\" }\n"
                               "workload { prompts_file: \"prompts.jsonl\" }\n"
                               "sweep {\n  spec_method: [\"ngram\", \"draft\"]\n}\n";
  ExpectError(no_draft, 4, 26, "sweep.spec_method[1]: \"draft\" needs draft { path: ... }");
}

// model.device and model.dtype run local points on a GPU; a value the engine lacks is named, and an
// endpoint's server keeps its own.
TEST_F(SpecTest, TheModelsDeviceAndDtypeAreCheckedByName) {
  const std::string model = "model { path: \"" + kModels + "/stories260K.bin\" ";
  const std::string rest = "workload { prompts_file: \"prompts.jsonl\" }\n";
  auto cuda = Parse(model + "device: \"cuda\" dtype: \"bf16\" }\n" + rest);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->spec.model().device(), "cuda");
  const int col = static_cast<int>(model.size()) + 1;
  ExpectError(model + "device: \"tpu\" }\n" + rest, 1, col, "model.device: 'tpu' is not cpu or cuda");
  ExpectError(model + "dtype: \"fp8\" }\n" + rest, 1, col, "model.dtype: 'fp8' is not f32, bf16 or f16");
  ExpectError(model + "device: \"cuda\" }\n" + rest + "mode: ONLINE\nendpoint: \"grpc://h:1\"\nsweep { request_rate: [4] }\n", 1,
              col, "model.device and model.dtype are for local points");
}

TEST_F(SpecTest, FilesMustExistAndPromptsMustParse) {
  ExpectError("model { path: \"nope.bin\" }\n", 1, 9, "model.path: " + dir_ + "/nope.bin does not exist");
  ExpectError("workload { num_requests: 4 }\n", 1, 1, "model.path is required");
  const std::string model = "model { path: \"" + kModels + "/stories260K.bin\" }\n";
  ExpectError(model + "workload { num_requests: 4 }\n", 2, 1,
              "workload needs prompts_file, synthetic { input_len output_len } or conversation");
  ExpectError(model + "workload {\n  prompts_file: \"bad.jsonl\"\n}\n", 3, 3, "bad.jsonl:2");
  ExpectError(model + "workload { synthetic { input_len: 0 output_len: 4 } }\n", 2, 12, "input_len and output_len");
  auto missing = LoadSpec(dir_ + "/absent.textproto");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("absent.textproto: cannot read the spec"), std::string::npos);
}

TEST_F(SpecTest, ReadDoneRunsDropsATornLastLineOnly) {
  const std::string path = dir_ + "/results.jsonl";
  std::ofstream(path) << "{\"key\": \"a\", \"repeat\": 0}\n{\"key\": \"a\", \"repeat\": 1}\n{\"key\": \"b\", \"rep";
  bool dropped = false;
  auto done = ReadDoneRuns(path, &dropped);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(dropped);
  EXPECT_EQ(*done, (std::set<std::pair<std::string, int>>{{"a", 0}, {"a", 1}}));
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "{\"key\": \"a\", \"repeat\": 0}\n{\"key\": \"a\", \"repeat\": 1}\n");  // cut off the file

  std::ofstream(path) << "{\"key\": \"a\", \"repeat\": 0}\nnot json\n{\"key\": \"b\", \"repeat\": 0}\n";
  auto bad = ReadDoneRuns(path, &dropped);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("results.jsonl:2: not a results line"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace specula::experiments
