// The load generator without `specula serve`: the schedule, the statistics, the SSE parser, the run
// loop with a fake client, and both real clients against small fake servers on loopback.
#include "serving/load_gen.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>

#include "nlohmann/json.hpp"
#include "specula/v1/generation.grpc.pb.h"
#include "tools/bench_serve.h"

namespace specula {
namespace {

// Time limits on what the clients measure are multiplied by this: 10 under ThreadSanitizer
// (SPECULA_SANITIZER=tsan, scripts/tsan.sh), whose threads run 5-15x slower; 1 otherwise.
double TimeSlack() {
  const char* s = std::getenv("SPECULA_SANITIZER");
  return s != nullptr && std::string(s) == "tsan" ? 10.0 : 1.0;
}

using json = nlohmann::json;

std::vector<double> Gaps(const std::vector<double>& t) {
  std::vector<double> g(t.size());
  std::adjacent_difference(t.begin(), t.end(), g.begin());
  return g;
}

double Mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

double Cv(const std::vector<double>& v) {
  const double m = Mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / (v.size() - 1)) / m;
}

int CountIn(const std::vector<double>& t, double lo, double hi) {
  return static_cast<int>(std::count_if(t.begin(), t.end(), [&](double x) { return x >= lo && x < hi; }));
}

TEST(ArrivalTimes, MeanRateAndGammaVariance) {
  for (double b : {0.25, 1.0, 4.0}) {
    ArrivalOptions o{.num_requests = 20000, .request_rate = 10, .burstiness = b, .seed = 7};
    const std::vector<double> t = ArrivalTimes(o);
    ASSERT_EQ(t.size(), 20000u);
    ASSERT_TRUE(std::is_sorted(t.begin(), t.end()));
    EXPECT_NEAR(t.size() / t.back(), 10.0, 0.3) << "burstiness " << b;
    EXPECT_NEAR(Cv(Gaps(t)), 1 / std::sqrt(b), 0.1 / std::sqrt(b)) << "gamma CV = 1/sqrt(B), B=" << b;
  }
}

TEST(ArrivalTimes, BurstWindowMultipliesTheRate) {
  ArrivalOptions o{.num_requests = 6000, .request_rate = 10, .burst_factor = 4, .burst_start_s = 100,
                   .burst_duration_s = 100, .seed = 3};
  const std::vector<double> t = ArrivalTimes(o);
  EXPECT_NEAR(CountIn(t, 0, 100) / 100.0, 10, 1.0);
  EXPECT_NEAR(CountIn(t, 100, 200) / 100.0, 40, 2.0);
  EXPECT_NEAR(CountIn(t, 200, 280) / 80.0, 10, 1.0);
  // A lull (factor < 1) works the same way.
  o.burst_factor = 0.1;
  const std::vector<double> lull = ArrivalTimes(o);
  EXPECT_NEAR(CountIn(lull, 100, 200) / 100.0, 1, 0.4);
}

TEST(ArrivalTimes, InfiniteRateIsAllAtZeroAndSeedsAreDeterministic) {
  ArrivalOptions inf{.num_requests = 50};
  EXPECT_EQ(ArrivalTimes(inf), std::vector<double>(50, 0.0));
  ArrivalOptions o{.num_requests = 100, .request_rate = 5, .burstiness = 0.5, .seed = 11};
  EXPECT_EQ(ArrivalTimes(o), ArrivalTimes(o));
  ArrivalOptions other = o;
  other.seed = 12;
  EXPECT_NE(ArrivalTimes(o), ArrivalTimes(other));
}

TEST(Goodput, ParsesVllmSyntaxAndRejectsBadStrings) {
  auto slo = ParseGoodput("ttft:500 tpot:50.5");
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_EQ(slo->ttft_ms, 500);
  EXPECT_EQ(slo->tpot_ms, 50.5);
  EXPECT_FALSE(slo->e2el_ms.has_value());
  EXPECT_EQ(ParseGoodput("e2el:2000")->e2el_ms, 2000);
  for (const char* bad : {"", "ttft", "ttft=5", "ttfb:5", "ttft:abc", "ttft:-1", "ttft:0", "ttft:5 ttft:6"}) {
    EXPECT_FALSE(ParseGoodput(bad).ok()) << "'" << bad << "'";
  }
  EXPECT_NE(ParseGoodput("ttfb:5").status().message().find("ttfb"), std::string::npos);
}

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  std::vector<double> hundred(100);
  std::iota(hundred.begin(), hundred.end(), 1.0);
  EXPECT_NEAR(Percentile(hundred, 99), 99.01, 1e-9);
  const Stats s = Summarize(std::vector<double>{3, 1, 2, 10});
  EXPECT_DOUBLE_EQ(s.mean, 4);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_NEAR(s.p99, 9.79, 1e-9);
  EXPECT_EQ(Summarize(std::vector<double>{}).count, 0);
}

TEST(Stats, SummaryCountsOutcomesTpotAndGoodput) {
  RunResult run;
  run.duration_s = 2.0;
  RequestResult a{.outcome = Outcome::kOk, .ttft_s = 0.1, .e2e_s = 1.1, .itl_s = {0.5, 0.5}, .prompt_tokens = 5,
                  .output_tokens = 11};
  RequestResult b{.outcome = Outcome::kOk, .ttft_s = 0.3, .e2e_s = 0.3, .prompt_tokens = 7, .output_tokens = 1};
  RequestResult rejected{.outcome = Outcome::kRejected, .error = "full", .e2e_s = 0.002};
  RequestResult failed{.outcome = Outcome::kFailed, .error = "boom", .e2e_s = 1};
  run.requests = {a, b, rejected, failed, failed};
  BenchSummary s = Summarize(run, ParseGoodput("ttft:200").value());
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.first_errors, std::vector<std::string>{"boom"});
  EXPECT_EQ(s.total_input_tokens, 12);
  EXPECT_EQ(s.total_output_tokens, 12);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 6.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 12.0);
  EXPECT_EQ(s.tpot_ms.count, 1);  // (1.1 - 0.1) s / 10 tokens; one-token requests have none
  EXPECT_NEAR(s.tpot_ms.mean, 100, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 2);
  EXPECT_NEAR(s.itl_ms.mean, 500, 1e-9);
  EXPECT_NEAR(s.ttft_ms.median, 200, 1e-9);
  EXPECT_DOUBLE_EQ(s.tokens_per_message, 12.0 / 4);  // 3 messages + 1
  EXPECT_NEAR(s.rejection_ms.p99, 2, 1e-9);
  EXPECT_EQ(s.good, 1);  // a: TTFT 100 ms; b: 300 ms
  EXPECT_DOUBLE_EQ(s.request_goodput, 0.5);
  s = Summarize(run, ParseGoodput("tpot:50").value());
  EXPECT_EQ(s.good, 1);  // b only: a one-token request meets any TPOT goal
  EXPECT_EQ(Summarize(run, GoodputSlo{}).good, 2);
}

std::tuple<int32_t, int32_t, int32_t, int32_t> Counts(const BenchSummary::ReplicaCounts& c) {
  return {c.requests, c.ok, c.rejected, c.failed};
}

// Per replica: each request under the replica it named, by outcome; the rest apart. Every failure
// (not a refusal) by its error's first 120 bytes, never splitting a UTF-8 character.
TEST(Stats, SummaryCountsPerReplicaAndFailuresByCause) {
  const std::string head(119, 'x');  // then a 2-byte character across the 120th byte
  RunResult run;
  run.requests = {{.outcome = Outcome::kOk, .replica = "a"},
                  {.outcome = Outcome::kOk, .replica = "a"},
                  {.outcome = Outcome::kRejected, .error = "full", .replica = "a"},
                  {.outcome = Outcome::kFailed, .error = head + "\xc3\xa9 one", .replica = "b"},
                  {.outcome = Outcome::kFailed, .error = head + "\xc3\xa9 two", .replica = "b"},
                  {.outcome = Outcome::kOk, .replica = "b"},
                  {.outcome = Outcome::kFailed, .error = "HTTP: could not connect"}};
  const BenchSummary s = Summarize(run, GoodputSlo{});
  ASSERT_EQ(s.replicas.size(), 2u);
  EXPECT_EQ(Counts(s.replicas.at("a")), std::make_tuple(3, 2, 1, 0));
  EXPECT_EQ(Counts(s.replicas.at("b")), std::make_tuple(3, 1, 0, 2));
  EXPECT_EQ(s.without_replica, 1);
  EXPECT_EQ(s.failed_by_error, (std::map<std::string, int32_t>{{head, 2}, {"HTTP: could not connect", 1}}));
  EXPECT_EQ(s.failed, 3);
  EXPECT_TRUE(Summarize(RunResult{}, GoodputSlo{}).replicas.empty());
}

TEST(SseParser, ReassemblesEventsSplitAnywhere) {
  const std::string stream = "data: {\"a\":1}\r\n\r\n: keep-alive\n\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "[DONE]"};
  for (size_t split = 0; split <= stream.size(); ++split) {
    SseParser p;
    std::vector<std::string> got;
    auto on = [&](std::string_view d) { got.emplace_back(d); };
    p.Feed(std::string_view(stream).substr(0, split), on);
    p.Feed(std::string_view(stream).substr(split), on);
    EXPECT_EQ(got, want) << "split at " << split;
  }
  SseParser p;
  std::vector<std::string> got;
  for (char c : stream) p.Feed(std::string_view(&c, 1), [&](std::string_view d) { got.emplace_back(d); });
  EXPECT_EQ(got, want);
}

TEST(Dataset, JsonlLinesAndErrorsNamingTheLine) {
  const std::string path = ::testing::TempDir() + "/loadgen_prompts.jsonl";
  std::ofstream(path) << "{\"prompt\": \"hi\", \"max_tokens\": 5}\n\n{\"prompt\": \"yo\", \"ignore_eos\": true}\n";
  auto d = LoadJsonlDataset(path, 7);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[0].prompt, "hi");
  EXPECT_EQ((*d)[0].max_tokens, 5);
  EXPECT_EQ((*d)[1].max_tokens, 7);
  EXPECT_TRUE((*d)[1].ignore_eos);
  std::ofstream(path) << "{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n";
  EXPECT_NE(LoadJsonlDataset(path, 0).status().message().find(":2: field 'prompt'"), std::string::npos);
  std::ofstream(path) << "{\"prompt\": \"ok\", \"max_tokens\": -1}\n";
  EXPECT_NE(LoadJsonlDataset(path, 0).status().message().find(":1: field 'max_tokens'"), std::string::npos);
  EXPECT_NE(LoadJsonlDataset("/nope.jsonl", 0).status().message().find("/nope.jsonl"), std::string::npos);
}

// A line's structured-output fields become its constraint (a schema keeps its properties' order);
// tools, which are chat's, are refused naming the line.
TEST(Dataset, ConstraintFieldsOfALine) {
  const std::string path = ::testing::TempDir() + "/loadgen_constrained.jsonl";
  std::ofstream(path) << R"({"prompt": "a", "json_schema": {"type": "object", "properties": {"z": {}, "a": {}}}})" "\n"
                      << R"({"prompt": "b", "structured_outputs": {"choice": ["x", "y"]}})" "\n"
                      << R"({"prompt": "c"})" "\n";
  auto d = LoadJsonlDataset(path, 7);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[0].constraint.kind, ConstraintSpec::Kind::kJsonSchema);
  EXPECT_EQ((*d)[0].constraint.text, R"({"type":"object","properties":{"z":{},"a":{}}})");
  EXPECT_EQ((*d)[1].constraint.kind, ConstraintSpec::Kind::kChoice);
  EXPECT_EQ((*d)[1].constraint.choices, (std::vector<std::string>{"x", "y"}));
  EXPECT_FALSE((*d)[2].constraint.active());
  std::ofstream(path) << R"({"prompt": "a", "guided_regex": "a+", "guided_choice": ["a"]})" "\n";
  EXPECT_NE(LoadJsonlDataset(path, 0).status().message().find(":1: guided_choice: cannot be combined"), std::string::npos);
  std::ofstream(path) << R"({"prompt": "a", "tools": []})" "\n";
  EXPECT_NE(LoadJsonlDataset(path, 0).status().message().find(":1: field 'tools'"), std::string::npos);
}

TEST(Dataset, SyntheticPromptsAreInVocabAndDeterministic) {
  const auto d = SyntheticDataset(3, 5, 6, 10, 1);
  ASSERT_EQ(d.size(), 3u);
  for (const LoadRequest& r : d) {
    EXPECT_EQ(r.prompt_token_ids.size(), 5u);
    for (int32_t t : r.prompt_token_ids) EXPECT_TRUE(t >= 0 && t < 10);
    EXPECT_EQ(r.max_tokens, 6);
    EXPECT_TRUE(r.ignore_eos);
  }
  EXPECT_EQ(SyntheticDataset(3, 5, 6, 10, 1)[2].prompt_token_ids, d[2].prompt_token_ids);
  EXPECT_NE(SyntheticDataset(3, 50, 6, 1000, 2)[0].prompt_token_ids, SyntheticDataset(3, 50, 6, 1000, 1)[0].prompt_token_ids);
}

// Sleeps 30 ms per request and records how many were in flight at once.
class FakeClient : public LoadClient {
 public:
  const ServerInfo& info() const override { return info_; }
  RequestResult Send(const LoadRequest& r) override {
    const int now = ++in_flight;
    for (int m = max_in_flight; now > m && !max_in_flight.compare_exchange_weak(m, now);) {}
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    --in_flight;
    return RequestResult{.outcome = Outcome::kOk, .e2e_s = 0.03, .output_tokens = r.max_tokens};
  }
  std::atomic<int> in_flight{0}, max_in_flight{0};
  ServerInfo info_;
};

TEST(RunLoad, MaxConcurrencyBoundsRequestsInFlight) {
  FakeClient client;
  std::vector<LoadRequest> reqs(20);
  for (int i = 0; i < 20; ++i) reqs[i].max_tokens = i;
  const RunResult run = RunLoad(client, reqs, std::vector<double>(20, 0.0), RunOptions{.max_concurrency = 4});
  EXPECT_EQ(client.max_in_flight, 4);
  EXPECT_GE(run.duration_s, 5 * 0.03 * 0.95);  // 20 requests, 4 at a time
  for (int i = 0; i < 20; ++i) EXPECT_EQ(run.requests[i].output_tokens, i) << "results stay in dataset order";
}

TEST(RunLoad, SendsEachRequestAtItsArrival) {
  FakeClient client;
  const std::vector<double> arrivals = {0.0, 0.05, 0.1, 0.1, 0.2};
  int progress_calls = 0;
  const RunResult run = RunLoad(client, std::vector<LoadRequest>(5), arrivals,
                                RunOptions{.on_progress = [&](int32_t done, int32_t total) {
                                  EXPECT_EQ(done, ++progress_calls);
                                  EXPECT_EQ(total, 5);
                                }});
  EXPECT_EQ(progress_calls, 5);
  for (size_t i = 0; i < arrivals.size(); ++i) EXPECT_NEAR(run.requests[i].send_s, arrivals[i], 0.02 * TimeSlack()) << i;
  EXPECT_NEAR(run.duration_s, 0.23, 0.03 * TimeSlack());
}

// ---- The real clients against fake servers on loopback.

// ModelInfo says vocab 1000. Generate refuses every other call; the others get 1, 2 and 3 tokens
// in three messages 20 ms apart (as speculation sends several tokens at once). Calls 0 and 1 of
// every four name replica r-a in their initial metadata, 2 and 3 r-b, refused or not.
class FakeGeneration final : public v1::Generation::Service {
 public:
  grpc::Status ModelInfo(grpc::ServerContext*, const v1::ModelInfoRequest*, v1::ModelInfoResponse* r) override {
    r->set_model("fake-model");
    r->set_vocab_size(1000);
    return grpc::Status::OK;
  }
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* q,
                        grpc::ServerWriter<v1::GenerateResponse>* w) override {
    max_tokens = q->sampling().max_tokens();
    ignore_eos = q->sampling().ignore_eos();
    for (int32_t t : q->prompt_token_ids()) max_prompt_id = std::max<int>(max_prompt_id, t);
    {
      std::lock_guard lock(mu);
      prompt = q->prompt();
      const auto id = ctx->client_metadata().find("x-session-id");
      session_id = id == ctx->client_metadata().end() ? "" : std::string(id->second.data(), id->second.size());
    }
    const int call = calls++;
    ctx->AddInitialMetadata("x-specula-replica", call % 4 < 2 ? "r-a" : "r-b");
    if (call % 2 == 1) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full");
    for (int m = 1; m <= 3; ++m) {
      if (m > 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      v1::GenerateResponse r;
      for (int i = 0; i < m; ++i) r.add_token_ids(i);
      r.set_text(std::string(m, 'a' + m - 1));  // "a", "bb", "ccc"
      if (m == 3) {
        r.mutable_usage()->set_prompt_tokens(q->prompt_token_ids_size() + 1);
        r.mutable_usage()->set_cached_prompt_tokens(2);
      }
      w->Write(r);
    }
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0}, max_tokens{0}, max_prompt_id{-1};
  std::atomic<bool> ignore_eos{false};
  std::mutex mu;
  std::string prompt, session_id;  // the last call's, guarded by mu
};

struct GrpcFake {
  GrpcFake() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~GrpcFake() { server->Shutdown(); }
  std::string endpoint() const { return "grpc://127.0.0.1:" + std::to_string(port); }
  FakeGeneration service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// /v1/completions: prompt "reject" gets a 429; prompt "fail" a 500 that names no replica (as a
// proxy's own error would); others stream "Once", " upon" and a closing chunk (empty text,
// finish_reason) 20 ms apart, then usage (3 tokens) and [DONE]. Every other answer names replica h-1.
struct HttpFake {
  HttpFake() {
    http.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model"}]})", "application/json");
    });
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& res) {
      const json body = json::parse(q.body);
      {
        std::lock_guard lock(mu);
        last_body = body;
        last_path = q.path;
        session_header = q.get_header_value("X-Session-Id");
      }
      if (body["prompt"] == "fail") {
        res.status = 500;
        res.set_content(R"({"error":{"message":"replica down","code":500}})", "application/json");
        return;
      }
      res.set_header("X-Specula-Replica", "h-1");
      if (body["prompt"] == "reject") {
        res.status = 429;
        res.set_content(R"({"error":{"message":"queue full","code":429}})", "application/json");
        return;
      }
      res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
        for (std::string text : {"Once", " upon", ""}) {
          const json choice = {{"index", 0}, {"text", text}, {"finish_reason", text.empty() ? json("length") : json()}};
          const std::string line = "data: " + json{{"choices", json::array({choice})}}.dump() + "\n\n";
          sink.write(line.data(), line.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        const std::string tail =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        sink.write(tail.data(), tail.size());
        sink.done();
        return true;
      });
    });
    // Chat: an opening delta with the role and no content (as vLLM sends), "Hi", " there", a closing
    // chunk, then usage with 3 cached prompt tokens.
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& res) {
      {
        std::lock_guard lock(mu);
        last_body = json::parse(q.body);
        last_path = q.path;
        session_header = q.get_header_value("X-Session-Id");
      }
      res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
        const std::vector<json> deltas = {{{"role", "assistant"}, {"content", ""}}, {{"content", "Hi"}},
                                          {{"content", " there"}}, json::object()};
        for (size_t i = 0; i < deltas.size(); ++i) {
          const bool last = i + 1 == deltas.size();
          const json choice = {{"index", 0}, {"delta", deltas[i]}, {"finish_reason", last ? json("stop") : json()}};
          const std::string line = "data: " + json{{"choices", json::array({choice})}}.dump() + "\n\n";
          sink.write(line.data(), line.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        const std::string tail = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,"
                                 "\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\ndata: [DONE]\n\n";
        sink.write(tail.data(), tail.size());
        sink.done();
        return true;
      });
    });
    port = http.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { http.listen_after_bind(); });
  }
  ~HttpFake() {
    http.stop();
    thread.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port); }
  httplib::Server http;
  std::thread thread;
  int port = 0;
  std::mutex mu;
  json last_body;
  std::string last_path, session_header;
};

TEST(Clients, GrpcTimesEachMessageAndCountsRefusals) {
  GrpcFake fake;
  auto client = ConnectLoadClient(fake.endpoint(), {});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->info().model, "fake-model");
  EXPECT_EQ((*client)->info().vocab_size, 1000);
  const LoadRequest r{.prompt_token_ids = {1, 2, 3}, .max_tokens = 6, .ignore_eos = true};
  const RequestResult ok = (*client)->Send(r);
  ASSERT_EQ(ok.outcome, Outcome::kOk) << ok.error;
  EXPECT_EQ(ok.replica, "r-a");  // the server's initial metadata
  EXPECT_EQ(ok.output_tokens, 6);
  EXPECT_EQ(ok.prompt_tokens, 4);  // the server's usage, not the ids sent
  ASSERT_EQ(ok.itl_s.size(), 2u);  // a gap per message, not per token
  for (double g : ok.itl_s) EXPECT_NEAR(g, 0.02, 0.015 * TimeSlack());
  EXPECT_LT(ok.ttft_s, 0.015 * TimeSlack());
  EXPECT_GE(ok.e2e_s, 0.04);
  EXPECT_EQ(fake.service.max_tokens, 6);
  EXPECT_TRUE(fake.service.ignore_eos);
  const RequestResult refused = (*client)->Send(r);
  EXPECT_EQ(refused.outcome, Outcome::kRejected);
  EXPECT_NE(refused.error.find("queue full"), std::string::npos) << refused.error;
  EXPECT_EQ(refused.replica, "r-a");  // a refusal names its replica too
}

TEST(Clients, HttpParsesTheEventStreamAndCounts429AsRejected) {
  HttpFake fake;
  auto client = ConnectLoadClient(fake.endpoint(), {.temperature = 0.5});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->info().model, "fake-model");  // from GET /v1/models
  const RequestResult ok = (*client)->Send(LoadRequest{.prompt_token_ids = {5, 6}, .max_tokens = 3, .ignore_eos = true});
  ASSERT_EQ(ok.outcome, Outcome::kOk) << ok.error;
  EXPECT_EQ(ok.replica, "h-1");    // the X-Specula-Replica header
  EXPECT_EQ(ok.output_tokens, 3);  // from usage
  EXPECT_EQ(ok.prompt_tokens, 4);
  ASSERT_EQ(ok.itl_s.size(), 1u);  // the closing chunk carries no token
  EXPECT_NEAR(ok.itl_s[0], 0.02, 0.015 * TimeSlack());
  EXPECT_GE(ok.e2e_s, 0.05);
  {
    std::lock_guard lock(fake.mu);
    EXPECT_EQ(fake.last_body["model"], "fake-model");
    EXPECT_EQ(fake.last_body["prompt"], json({5, 6}));
    EXPECT_EQ(fake.last_body["max_tokens"], 3);
    EXPECT_EQ(fake.last_body["stream"], true);
    EXPECT_EQ(fake.last_body["ignore_eos"], true);
    EXPECT_EQ(fake.last_body["temperature"], 0.5);
  }
  const RequestResult refused = (*client)->Send(LoadRequest{.prompt = "reject"});
  EXPECT_EQ(refused.outcome, Outcome::kRejected);
  EXPECT_EQ(refused.error, "HTTP 429: queue full");
  EXPECT_EQ(refused.replica, "h-1");
  const RequestResult failed = (*client)->Send(LoadRequest{.prompt = "fail"});
  EXPECT_EQ(failed.outcome, Outcome::kFailed);
  EXPECT_EQ(failed.replica, "");
  LoadRequest constrained{.prompt = "json please"};
  constrained.constraint = {ConstraintSpec::Kind::kJsonSchema, R"({"type":"object"})", {}, "json_schema"};
  ASSERT_EQ((*client)->Send(constrained).outcome, Outcome::kOk);
  std::lock_guard lock(fake.mu);
  EXPECT_EQ(fake.last_body["structured_outputs"], json({{"json", R"({"type":"object"})"}}));
}

// A conversation's turn: over HTTP, chat with the messages and the X-Session-Id header, its answer's
// text kept and the cached tokens read from usage; over gRPC, one prompt of the contents, line by
// line, with x-session-id metadata.
TEST(Clients, ConversationTurnsCarryTheHistoryAndTheSessionId) {
  LoadRequest turn{.max_tokens = 4};
  turn.messages = {{"system", "Be brief."}, {"user", "Hello"}, {"assistant", "Hi"}, {"user", "More"}};
  turn.session = {"s3-1", 1, 1};
  HttpFake http;
  auto hc = ConnectLoadClient(http.endpoint(), {});
  ASSERT_TRUE(hc.ok()) << hc.status();
  const RequestResult h = (*hc)->Send(turn);
  ASSERT_EQ(h.outcome, Outcome::kOk) << h.error;
  EXPECT_EQ(h.text, "Hi there");
  EXPECT_EQ(h.prompt_tokens, 9);
  EXPECT_EQ(h.cached_tokens, 3);
  EXPECT_EQ(h.output_tokens, 2);
  EXPECT_EQ(h.itl_s.size(), 1u);  // the opening delta carries no token: "Hi" and " there" do
  EXPECT_GE(h.ttft_s, 0.015);
  {
    std::lock_guard lock(http.mu);
    EXPECT_EQ(http.last_path, "/v1/chat/completions");
    EXPECT_EQ(http.session_header, "s3-1");
    EXPECT_EQ(http.last_body["messages"], json::parse(R"([{"role":"system","content":"Be brief."},)"
                                                      R"({"role":"user","content":"Hello"},)"
                                                      R"({"role":"assistant","content":"Hi"},)"
                                                      R"({"role":"user","content":"More"}])"));
    EXPECT_FALSE(http.last_body.contains("prompt"));
    EXPECT_EQ(http.last_body["stream_options"]["include_usage"], true);
    EXPECT_EQ(http.last_body["max_tokens"], 4);
  }
  const RequestResult plain = (*hc)->Send(LoadRequest{.prompt = "x"});  // no session: no header
  ASSERT_EQ(plain.outcome, Outcome::kOk);
  EXPECT_TRUE(plain.text.empty());  // kept for conversations only
  {
    std::lock_guard lock(http.mu);
    EXPECT_EQ(http.last_path, "/v1/completions");
    EXPECT_EQ(http.session_header, "");
  }

  GrpcFake grpc;
  auto gc = ConnectLoadClient(grpc.endpoint(), {});
  ASSERT_TRUE(gc.ok()) << gc.status();
  const RequestResult g = (*gc)->Send(turn);
  ASSERT_EQ(g.outcome, Outcome::kOk) << g.error;
  EXPECT_EQ(g.text, "abbccc");
  EXPECT_EQ(g.cached_tokens, 2);
  std::lock_guard lock(grpc.service.mu);
  EXPECT_EQ(grpc.service.prompt, "Be brief.\nHello\nHi\nMore");
  EXPECT_EQ(grpc.service.session_id, "s3-1");
}

int ClosedPort() {  // a port that was free a moment ago: connecting is refused
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), len);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(Clients, UnreachableEndpointIsOneLineNamingIt) {
  const int port = ClosedPort();
  for (const char* scheme : {"grpc", "http"}) {
    const std::string endpoint = std::string(scheme) + "://127.0.0.1:" + std::to_string(port);
    const auto c = ConnectLoadClient(endpoint, {});
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("cannot reach " + endpoint), std::string::npos) << c.status();
    EXPECT_EQ(c.status().message().find('\n'), std::string::npos) << c.status();
  }
}

absl::Status Bench(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return RunBenchServe(static_cast<int>(argv.size()), argv.data());
}

TEST(BenchServe, BadFlagsNameTheFlagAndValue) {
  const std::vector<std::string> e = {"--endpoint", "grpc://127.0.0.1:1"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), e.begin(), e.end());
    return more;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--num-prompts", "3"}, "--endpoint is required"},
      {{"--endpoint", "ftp://h:1"}, "--endpoint: 'ftp://h:1' is not grpc://HOST:PORT"},
      {with({"--request-rate", "-3"}), "--request-rate must be > 0 or inf, got -3"},
      {with({"--request-rate", "fast"}), "--request-rate: 'fast' is not a number"},
      {with({"--burstiness", "0"}), "--burstiness must be > 0, got 0"},
      {with({"--max-concurrency", "0"}), "--max-concurrency must be >= 1, got 0"},
      {with({"--num-prompts", "0"}), "--num-prompts must be >= 1, got 0"},
      {with({"--request-rate", "5", "--burst-factor", "3"}), "needs both --burst-factor and --burst-duration-s"},
      {with({"--burst-factor", "3", "--burst-duration-s", "2"}), "needs a finite --request-rate"},
      {with({"--request-rate", "5", "--burst-factor", "-1", "--burst-duration-s", "2"}), "--burst-factor must be > 0"},
      {with({"--goodput", "ttft:5", "tpot:x"}), "--goodput: 'tpot:x'"},
      {with({"--dataset-path", "f.jsonl", "--input-len", "3"}), "--input-len and --vocab-size are for synthetic"},
      {with({"--dataset-path", "/nope.jsonl"}), "--dataset-path: /nope.jsonl"},
      {with({"--temperature", "-1"}), "--temperature must be >= 0, got -1"},
      {with({"--bogus", "1"}), "unknown flag --bogus"},
      {with({"--multi-turn", "--turns", "0"}), "--turns must be in [1, 10000], got 0"},
      {with({"--multi-turn", "--num-sessions", "-1"}), "--num-sessions must be in [1, 1000000], got -1"},
      {with({"--multi-turn", "--turn-routing", "bogus"}), "--turn-routing: 'bogus' is not session or rotate"},
      {with({"--multi-turn", "--session-concurrency", "0"}), "--session-concurrency must be >= 1, got 0"},
      {with({"--multi-turn", "--think-time-s", "-1"}), "--think-time-s must be >= 0, got -1"},
      {with({"--multi-turn", "--max-tokens", "0"}), "--max-tokens must be >= 1, got 0"},
      {with({"--multi-turn", "--input-len", "8"}), "--input-len does not apply to --multi-turn"},
      {with({"--multi-turn", "--vocab-size", "8"}), "--vocab-size does not apply to --multi-turn"},
      {with({"--multi-turn", "--request-rate", "8"}), "--request-rate does not apply to --multi-turn"},
      {with({"--multi-turn", "--dataset-path", "f.jsonl"}), "--dataset-path does not apply to --multi-turn (user messages: --user-messages)"},
      {with({"--multi-turn", "--user-messages", "f", "--user-words", "3"}), "--user-words is for synthetic user messages"},
      {with({"--multi-turn", "--user-messages", "/nope.jsonl"}), "--user-messages: /nope.jsonl: cannot open"},
      {with({"--turns", "3"}), "--turns needs --multi-turn"},
      {with({"--ignore-eos"}), "--ignore-eos needs --multi-turn"},
      {{"--endpoint", "grpc://127.0.0.1:1,grpc://127.0.0.1:2"}, "--endpoint: a list of endpoints"},
      {{"--multi-turn", "--endpoint", "ftp://h:2,grpc://127.0.0.1:1"}, "--endpoint: 'ftp://h:2' is not grpc://HOST:PORT"},
  };
  for (const auto& [args, want] : cases) {
    const absl::Status st = Bench(args);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(want), std::string::npos) << "got: " << st.message() << "\nwant: " << want;
  }
}

TEST(BenchServe, GrpcRunWritesTheResultJson) {
  GrpcFake fake;
  const std::string out = ::testing::TempDir() + "/loadgen_grpc.json";
  const absl::Status st = Bench({"--endpoint", fake.endpoint(), "--num-prompts", "6", "--input-len", "4",
                                 "--output-len", "6", "--vocab-size", "5", "--goodput", "ttft:1000", "e2el:5000",
                                 "--result-json", out, "--save-detailed", "--no-progress"});
  ASSERT_TRUE(st.ok()) << st;
  const json j = json::parse(std::ifstream(out));
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["rejected"], 3);  // every other call
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_output_tokens"], 18);
  EXPECT_EQ(j["total_input_tokens"], 15);
  EXPECT_EQ(j["model_id"], "fake-model");
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["goodput"]["e2el"], 5000);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), j["request_throughput"].get<double>());
  // The median: one stall of a loaded machine (ASan in CI) moves the mean by 30 ms.
  EXPECT_NEAR(j["median_itl_ms"].get<double>(), 20, 15 * TimeSlack());
  EXPECT_DOUBLE_EQ(j["tokens_per_message"].get<double>(), 2.0);
  EXPECT_GT(j["p99_e2el_ms"].get<double>(), 40);
  EXPECT_EQ(j["ttfts"].size(), 6u);
  EXPECT_LT(fake.service.max_prompt_id, 5);  // --vocab-size
  EXPECT_EQ(fake.service.max_tokens, 6);
  // Each request's replica beside its outcome; the summary's per-replica counts are theirs and add up.
  ASSERT_EQ(j["request_replicas"].size(), 6u);
  std::map<std::string, std::map<std::string, int>> recount;  // by replica, by outcome and in all
  for (size_t i = 0; i < 6; ++i) {
    const std::string replica = j["request_replicas"][i], outcome = j["outcomes"][i];
    EXPECT_TRUE(replica == "r-a" || replica == "r-b") << replica;
    ++recount[replica]["requests"];
    ++recount[replica][outcome];
  }
  EXPECT_EQ(j["replicas"], json::parse(R"({"r-a": {"requests": 4, "ok": 2, "rejected": 2, "failed": 0},
                                          "r-b": {"requests": 2, "ok": 1, "rejected": 1, "failed": 0}})"));
  for (const auto& [replica, counts] : j["replicas"].items()) {
    for (const char* k : {"requests", "ok", "rejected"}) EXPECT_EQ(counts[k], recount[replica][k]) << replica << k;
  }
  EXPECT_EQ(j["requests_without_replica"], 0);
  EXPECT_EQ(j["failed_by_error"], json::object());
}

TEST(BenchServe, HttpRunWithDatasetAndSchedule) {
  HttpFake fake;
  const std::string data = ::testing::TempDir() + "/loadgen_http.jsonl";
  std::ofstream(data) << "{\"prompt\": \"Once upon\"}\n{\"prompt\": \"a time\", \"max_tokens\": 9}\n";
  const std::string out = ::testing::TempDir() + "/loadgen_http.json";
  const absl::Status st = Bench({"--endpoint", fake.endpoint(), "--dataset-path", data, "--num-prompts", "5",
                                 "--request-rate", "50", "--burstiness", "2", "--output-len", "4",
                                 "--max-concurrency", "2", "--result-json", out, "--no-progress"});
  ASSERT_TRUE(st.ok()) << st;
  const json j = json::parse(std::ifstream(out));
  EXPECT_EQ(j["completed"], 5);
  EXPECT_EQ(j["total_output_tokens"], 15);
  EXPECT_EQ(j["max_concurrency"], 2);
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_FALSE(j.contains("ttfts"));
  std::lock_guard lock(fake.mu);
  EXPECT_EQ(fake.last_body["prompt"], "Once upon");  // the 5th request reuses the first line
  EXPECT_EQ(fake.last_body["max_tokens"], 4);        // --output-len for lines without max_tokens
}

// Answers, refusals and failures over HTTP: the replica each named (none for the failures, as from a
// proxy's own 500), the per-replica counts, the failures by cause, in the table and the JSON.
TEST(BenchServe, HttpRunCountsReplicasAndFailuresByCause) {
  HttpFake fake;
  const std::string data = ::testing::TempDir() + "/loadgen_causes.jsonl";
  std::ofstream(data) << "{\"prompt\": \"Once\"}\n{\"prompt\": \"fail\"}\n{\"prompt\": \"reject\"}\n";
  const std::string out = ::testing::TempDir() + "/loadgen_causes.json";
  ::testing::internal::CaptureStdout();
  const absl::Status st = Bench({"--endpoint", fake.endpoint(), "--dataset-path", data, "--num-prompts", "6",
                                 "--result-json", out, "--save-detailed", "--no-progress"});
  const std::string table = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(st.ok()) << st;
  const json j = json::parse(std::ifstream(out));
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["rejected"], 2);
  EXPECT_EQ(j["failed"], 2);
  EXPECT_EQ(j["replicas"], json::parse(R"({"h-1": {"requests": 4, "ok": 2, "rejected": 2, "failed": 0}})"));
  EXPECT_EQ(j["requests_without_replica"], 2);
  EXPECT_EQ(j["failed_by_error"], json::parse(R"({"HTTP 500: replica down": 2})"));
  ASSERT_EQ(j["request_replicas"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(j["request_replicas"][i], j["outcomes"][i] == "failed" ? "" : "h-1") << i;
  }
  EXPECT_NE(table.find("Per Replica"), std::string::npos) << table;
  EXPECT_NE(table.find("(no replica named)"), std::string::npos) << table;
  EXPECT_NE(table.find("       2  HTTP 500: replica down\n"), std::string::npos) << table;
}

}  // namespace
}  // namespace specula
