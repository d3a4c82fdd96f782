// serving/metrics.h: the /metrics text for hand-built requests and snapshots with known numbers:
// counter values, cumulative histogram buckets at given `le` lines, _count and _sum, gauges,
// per-position spec-decode series, label escaping, rejection reasons, the line syntax of format
// 0.0.4, and concurrent recording.
#include "serving/metrics.h"

#include <cstdlib>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace specula {
namespace {

const std::string kLabels = "model_name=\"m\",engine=\"0\"";

// A finished request: arrival at 1000 ms, tokens at the given times, finished at `finish_ms`.
RequestOutput Finished(FinishReason reason, int32_t prompt_tokens, std::vector<double> token_ms, double finish_ms) {
  RequestOutput out;
  out.finish = reason;
  out.prompt_tokens = prompt_tokens;
  out.arrival_ms = 1000;
  out.tokens.assign(token_ms.size(), 7);
  if (!token_ms.empty()) out.first_token_ms = token_ms.front();
  out.token_ms = std::move(token_ms);
  out.finish_ms = finish_ms;
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The value of the one series written exactly as `series` (name and labels); fails if absent.
double Value(const std::string& text, const std::string& series) {
  for (const std::string& l : Lines(text)) {
    if (l.size() > series.size() && l.compare(0, series.size(), series) == 0 && l[series.size()] == ' ') {
      return std::strtod(l.c_str() + series.size() + 1, nullptr);
    }
  }
  ADD_FAILURE() << "no series " << series << " in:\n" << text;
  return -1;
}

bool Has(const std::string& text, const std::string& line) {
  for (const std::string& l : Lines(text)) if (l == line) return true;
  return false;
}

std::string Bucket(const std::string& name, const std::string& le) {
  return "specula:" + name + "_bucket{" + kLabels + ",le=\"" + le + "\"}";
}

TEST(MetricsTest, CountersFromFinishedRequests) {
  ServingMetrics m("m", {});
  m.OnFinished(Finished(FinishReason::kStopToken, 10, {1100, 1150}, 1200));
  m.OnFinished(Finished(FinishReason::kStopString, 5, {1100}, 1100));
  m.OnFinished(Finished(FinishReason::kMaxTokens, 20, {1100, 1200, 1300}, 1300));
  m.OnFinished(Finished(FinishReason::kAborted, 7, {}, 1500));
  m.OnFinished(Finished(FinishReason::kError, 3, {1100}, 1100));  // tokens count, the reason does not
  const std::string t = m.Render({});
  EXPECT_TRUE(Has(t, "# HELP specula:prompt_tokens_total Number of prefill tokens processed.")) << t;
  EXPECT_TRUE(Has(t, "# TYPE specula:prompt_tokens_total counter"));
  EXPECT_TRUE(Has(t, "specula:prompt_tokens_total{" + kLabels + "} 45.0"));
  EXPECT_TRUE(Has(t, "specula:generation_tokens_total{" + kLabels + "} 7.0"));
  EXPECT_TRUE(Has(t, "# TYPE specula:request_success_total counter"));
  EXPECT_TRUE(Has(t, "specula:request_success_total{" + kLabels + ",finished_reason=\"stop\"} 2.0"));
  EXPECT_TRUE(Has(t, "specula:request_success_total{" + kLabels + ",finished_reason=\"length\"} 1.0"));
  EXPECT_TRUE(Has(t, "specula:request_success_total{" + kLabels + ",finished_reason=\"abort\"} 1.0"));
  EXPECT_EQ(t.find("finished_reason=\"error\""), std::string::npos);
  // TTFT only for the four that got a token; e2e for all five.
  EXPECT_EQ(Value(t, "specula:time_to_first_token_seconds_count{" + kLabels + "}"), 4);
  EXPECT_EQ(Value(t, "specula:e2e_request_latency_seconds_count{" + kLabels + "}"), 5);
}

TEST(MetricsTest, AllFinishReasonsShowBeforeAnyRequest) {
  const std::string t = ServingMetrics("m", {}).Render({});
  for (const char* r : {"stop", "length", "abort"}) {
    EXPECT_TRUE(Has(t, "specula:request_success_total{" + kLabels + ",finished_reason=\"" + r + "\"} 0.0")) << r;
  }
  EXPECT_TRUE(Has(t, Bucket("time_to_first_token_seconds", "+Inf") + " 0.0"));
  EXPECT_TRUE(Has(t, "specula:time_to_first_token_seconds_sum{" + kLabels + "} 0.0"));
}

TEST(MetricsTest, TtftBucketsAreCumulativeAndUpperInclusive) {
  ServingMetrics m("m", {});
  for (double ttft_ms : {3.0, 50.0, 100.0, 300.0, 5000.0}) {
    m.OnFinished(Finished(FinishReason::kMaxTokens, 1, {1000 + ttft_ms}, 1000 + ttft_ms));
  }
  const std::string t = m.Render({});
  const std::string name = "time_to_first_token_seconds";
  EXPECT_TRUE(Has(t, "# TYPE specula:" + name + " histogram"));
  const std::vector<std::pair<std::string, double>> want = {
      {"0.001", 0}, {"0.005", 1}, {"0.04", 1}, {"0.06", 2}, {"0.08", 2}, {"0.1", 3},  // 0.1 s lands in le="0.1"
      {"0.25", 3},  {"0.5", 4},   {"2.5", 4},  {"5.0", 5},  {"2560.0", 5}, {"+Inf", 5}};
  for (const auto& [le, n] : want) EXPECT_EQ(Value(t, Bucket(name, le)), n) << "le=" << le;
  EXPECT_EQ(Value(t, "specula:" + name + "_count{" + kLabels + "}"), 5);
  EXPECT_NEAR(Value(t, "specula:" + name + "_sum{" + kLabels + "}"), 5.453, 1e-9);
  // vLLM's 22 bounds and +Inf, in order.
  std::vector<std::string> les;
  for (const std::string& l : Lines(t)) {
    const size_t le = l.find("le=\"") + 4;
    if (l.rfind("specula:" + name + "_bucket", 0) == 0) les.push_back(l.substr(le, l.find('"', le) - le));
  }
  EXPECT_EQ(les, (std::vector<std::string>{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1",
                                            "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0",
                                            "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"}));
}

// vLLM's request phases: queue (arrival to the first scheduling step, or to the end of a request
// aborted while waiting), prefill (scheduled to first token), decode (first to last token) and
// inference (scheduled to last token), on vLLM's request-latency buckets.
TEST(MetricsTest, QueuePrefillDecodeAndInferenceTimes) {
  ServingMetrics m("m", {});
  RequestOutput a = Finished(FinishReason::kMaxTokens, 4, {1400, 1500, 2900}, 3000);
  a.scheduled_ms = 1250;  // queued 0.25 s, prefill 0.15 s, decode 1.5 s, inference 1.65 s
  m.OnFinished(a);
  RequestOutput b = Finished(FinishReason::kStopToken, 4, {2100}, 2100);
  b.scheduled_ms = 2000;  // queued 1 s, prefill 0.1 s, decode 0 s, inference 0.1 s
  m.OnFinished(b);
  m.OnFinished(Finished(FinishReason::kAborted, 4, {}, 1600));  // never scheduled: queued 0.6 s, no more
  const std::string t = m.Render({});
  auto count = [&](const std::string& name) { return Value(t, "specula:" + name + "_count{" + kLabels + "}"); };
  auto sum = [&](const std::string& name) { return Value(t, "specula:" + name + "_sum{" + kLabels + "}"); };
  for (const char* name : {"request_queue_time_seconds", "request_prefill_time_seconds",
                           "request_decode_time_seconds", "request_inference_time_seconds"}) {
    EXPECT_TRUE(Has(t, "# TYPE specula:" + std::string(name) + " histogram")) << name;
  }
  EXPECT_EQ(count("request_queue_time_seconds"), 3);
  EXPECT_NEAR(sum("request_queue_time_seconds"), 0.25 + 1.0 + 0.6, 1e-9);
  EXPECT_EQ(Value(t, Bucket("request_queue_time_seconds", "0.3")), 1);
  EXPECT_EQ(Value(t, Bucket("request_queue_time_seconds", "0.8")), 2);
  EXPECT_EQ(Value(t, Bucket("request_queue_time_seconds", "1.0")), 3);  // upper-inclusive
  EXPECT_EQ(count("request_prefill_time_seconds"), 2);
  EXPECT_NEAR(sum("request_prefill_time_seconds"), 0.25, 1e-9);
  EXPECT_EQ(count("request_decode_time_seconds"), 2);
  EXPECT_NEAR(sum("request_decode_time_seconds"), 1.5, 1e-9);
  EXPECT_EQ(Value(t, Bucket("request_decode_time_seconds", "1.5")), 2);
  EXPECT_EQ(count("request_inference_time_seconds"), 2);
  EXPECT_NEAR(sum("request_inference_time_seconds"), 1.75, 1e-9);
  EXPECT_EQ(Value(t, Bucket("request_inference_time_seconds", "1.5")), 1);
  EXPECT_EQ(Value(t, Bucket("request_inference_time_seconds", "2.0")), 2);
  // vLLM's request_latency_buckets: 21 bounds and +Inf.
  std::vector<std::string> les;
  for (const std::string& l : Lines(t)) {
    const size_t le = l.find("le=\"") + 4;
    if (l.rfind("specula:request_queue_time_seconds_bucket", 0) == 0) les.push_back(l.substr(le, l.find('"', le) - le));
  }
  EXPECT_EQ(les, (std::vector<std::string>{"0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0",
                                            "20.0", "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0",
                                            "960.0", "1920.0", "7680.0", "+Inf"}));
}

TEST(MetricsTest, TimePerOutputTokenIsObservedPerStepAsInVllm) {
  ServingMetrics m("m", {});
  // Steps at 1100 (the first token), 1150 (3 speculative tokens), 1250 and 1550: three intervals.
  m.OnFinished(Finished(FinishReason::kMaxTokens, 4, {1100, 1150, 1150, 1150, 1250, 1550}, 1600));
  const std::string t = m.Render({});
  const std::string name = "time_per_output_token_seconds";
  EXPECT_EQ(Value(t, Bucket(name, "0.025")), 0);
  EXPECT_EQ(Value(t, Bucket(name, "0.05")), 1);
  EXPECT_EQ(Value(t, Bucket(name, "0.1")), 2);
  EXPECT_EQ(Value(t, Bucket(name, "0.2")), 2);
  EXPECT_EQ(Value(t, Bucket(name, "0.3")), 3);
  EXPECT_EQ(Value(t, Bucket(name, "+Inf")), 3);
  EXPECT_EQ(Value(t, "specula:" + name + "_count{" + kLabels + "}"), 3);
  EXPECT_NEAR(Value(t, "specula:" + name + "_sum{" + kLabels + "}"), 0.45, 1e-9);
  // e2e: 0.6 s, between vLLM's 0.5 and 0.8.
  EXPECT_EQ(Value(t, Bucket("e2e_request_latency_seconds", "0.5")), 0);
  EXPECT_EQ(Value(t, Bucket("e2e_request_latency_seconds", "0.8")), 1);
  EXPECT_NEAR(Value(t, "specula:e2e_request_latency_seconds_sum{" + kLabels + "}"), 0.6, 1e-9);
}

TEST(MetricsTest, TokenCountHistogramsUseOneTwoFiveBucketsUpToMaxModelLen) {
  EXPECT_EQ(ServingMetrics("m", {}).Render({}).find("request_prompt_tokens"), std::string::npos);
  ServingMetrics m("m", {}, {.max_model_len = 2048});
  m.OnFinished(Finished(FinishReason::kMaxTokens, 150, {1100, 1200, 1300}, 1300));
  const std::string t = m.Render({});
  EXPECT_EQ(Value(t, Bucket("request_prompt_tokens", "100.0")), 0);
  EXPECT_EQ(Value(t, Bucket("request_prompt_tokens", "200.0")), 1);
  EXPECT_EQ(Value(t, Bucket("request_prompt_tokens", "2000.0")), 1);
  EXPECT_EQ(t.find("le=\"5000.0\""), std::string::npos);
  EXPECT_EQ(Value(t, Bucket("request_generation_tokens", "2.0")), 0);
  EXPECT_EQ(Value(t, Bucket("request_generation_tokens", "5.0")), 1);
  EXPECT_EQ(Value(t, "specula:request_generation_tokens_sum{" + kLabels + "}"), 3);
  // Past 1e6 the bounds read as prometheus_client (Go) writes them.
  const std::string big = ServingMetrics("m", {}, {.max_model_len = 2000000}).Render({});
  EXPECT_TRUE(Has(big, Bucket("request_prompt_tokens", "500000.0") + " 0.0"));
  EXPECT_TRUE(Has(big, Bucket("request_prompt_tokens", "1e+06") + " 0.0"));
  EXPECT_TRUE(Has(big, Bucket("request_prompt_tokens", "2e+06") + " 0.0"));
}

TEST(MetricsTest, GaugesAndEngineCountersComeFromTheSnapshot) {
  EngineSnapshot s;
  s.num_running = 3;
  s.num_waiting = 2;
  s.kv_blocks_used = 30;
  s.kv_blocks_total = 120;
  s.num_preemptions = 4;
  s.prefix_cache_queries = 640;
  s.prefix_cache_hits = 128;
  s.stats.spec.drafts = 10;
  s.stats.spec.draft_tokens = 40;
  s.stats.spec.accepted_tokens = 25;
  s.stats.spec.accepted_per_position = {9, 8, 5, 3};
  s.stats.spec.forced_tokens = 12;
  s.stats.spec.forced_accepted = 7;
  s.stats.spec.cut_tokens = 6;
  s.stats.spec_k_histogram.assign(6, 0);  // k = 5: position 4 never accepted yet, still shown
  const std::string t = ServingMetrics("m", {}).Render(s);
  EXPECT_TRUE(Has(t, "# TYPE specula:num_requests_running gauge"));
  EXPECT_TRUE(Has(t, "specula:num_requests_running{" + kLabels + "} 3.0"));
  EXPECT_TRUE(Has(t, "specula:num_requests_waiting{" + kLabels + "} 2.0"));
  EXPECT_TRUE(Has(t, "specula:kv_cache_usage_perc{" + kLabels + "} 0.25"));
  EXPECT_TRUE(Has(t, "specula:num_preemptions_total{" + kLabels + "} 4.0"));
  EXPECT_TRUE(Has(t, "specula:prefix_cache_queries_total{" + kLabels + "} 640.0"));
  EXPECT_TRUE(Has(t, "specula:prefix_cache_hits_total{" + kLabels + "} 128.0"));
  EXPECT_TRUE(Has(t, "specula:spec_decode_num_drafts_total{" + kLabels + "} 10.0"));
  EXPECT_TRUE(Has(t, "specula:spec_decode_num_draft_tokens_total{" + kLabels + "} 40.0"));
  EXPECT_TRUE(Has(t, "specula:spec_decode_num_accepted_tokens_total{" + kLabels + "} 25.0"));
  EXPECT_TRUE(Has(t, "# TYPE specula:spec_decode_num_forced_draft_tokens_total counter"));
  EXPECT_TRUE(Has(t, "specula:spec_decode_num_forced_draft_tokens_total{" + kLabels + "} 12.0"));
  EXPECT_TRUE(Has(t, "specula:spec_decode_num_accepted_forced_tokens_total{" + kLabels + "} 7.0"));
  EXPECT_TRUE(Has(t, "specula:spec_decode_num_grammar_cut_tokens_total{" + kLabels + "} 6.0"));
  const std::vector<std::string> per_pos = {"9.0", "8.0", "5.0", "3.0", "0.0"};
  for (size_t i = 0; i < per_pos.size(); ++i) {
    EXPECT_TRUE(Has(t, "specula:spec_decode_num_accepted_tokens_per_pos_total{" + kLabels + ",position=\"" +
                           std::to_string(i) + "\"} " + per_pos[i])) << i;
  }
  EXPECT_EQ(t.find("position=\"5\""), std::string::npos);
  EXPECT_TRUE(Has(t, "# HELP specula:spec_decode_num_grammar_cut_tokens_total Number of proposed draft tokens cut "
                     "where they left a request's grammar (never verified)."));
  // A server without a proposer (k = 0) and no draft yet: every spec-decode counter at 0, there for
  // the grammar's forced drafts to count.
  const std::string none = ServingMetrics("m", {}).Render({});
  for (const char* name : {"drafts", "draft_tokens", "accepted_tokens", "forced_draft_tokens", "accepted_forced_tokens",
                           "grammar_cut_tokens"}) {
    EXPECT_TRUE(Has(none, std::string("specula:spec_decode_num_") + name + "_total{" + kLabels + "} 0.0")) << name;
  }
  // No KV pool yet: 0, not NaN.
  EXPECT_TRUE(Has(ServingMetrics("m", {}).Render({}), "specula:kv_cache_usage_perc{" + kLabels + "} 0.0"));
}

// The shared KV store's counters: the store's (KvStoreStats) and the engine's installs, each from its
// own field of the snapshot, with HELP and TYPE; all there at 0 on a server without a store.
TEST(MetricsTest, KvStoreCountersComeFromTheSnapshot) {
  EngineSnapshot s;
  KvStoreStats& k = s.stats.kv_store;
  k.fetches = 3;
  k.hit_blocks = 5;
  k.miss_blocks = 7;
  k.read_bytes = 11;
  k.written_bytes = 13;
  k.writes = 17;
  k.dropped_writes = 19;
  k.timeouts = 23;
  k.errors = 29;
  k.fetch_seconds = 0.25;
  s.stats.kv_installed_blocks = 31;
  s.stats.kv_rejected_blocks = 37;
  s.stats.kv_install_seconds = 0.5;
  const std::vector<std::pair<std::string, std::string>> want = {
      {"fetches", "3.0"}, {"hit_blocks", "5.0"}, {"miss_blocks", "7.0"}, {"read_bytes", "11.0"},
      {"written_bytes", "13.0"}, {"writes", "17.0"}, {"dropped_writes", "19.0"}, {"timeouts", "23.0"},
      {"errors", "29.0"}, {"fetch_seconds", "0.25"}, {"installed_blocks", "31.0"}, {"rejected_blocks", "37.0"},
      {"install_seconds", "0.5"}};
  const std::string t = ServingMetrics("m", {}).Render(s);
  const std::string none = ServingMetrics("m", {}).Render({});
  for (const auto& [name, value] : want) {
    const std::string family = "specula:kv_store_" + name + "_total";
    EXPECT_TRUE(Has(t, "# TYPE " + family + " counter")) << name;
    EXPECT_NE(t.find("\n# HELP " + family + " "), std::string::npos) << name;
    EXPECT_TRUE(Has(t, family + "{" + kLabels + "} " + value)) << name;
    EXPECT_TRUE(Has(none, family + "{" + kLabels + "} 0.0")) << name;
  }
}

TEST(MetricsTest, RejectionReasonsArePreRegisteredAndCounted) {
  ServingMetrics m("m", {"queue_len", "draining"});
  std::string t = m.Render({});
  EXPECT_TRUE(Has(t, "# TYPE specula:admission_rejected_total counter"));
  EXPECT_TRUE(Has(t, "specula:admission_rejected_total{" + kLabels + ",reason=\"queue_len\"} 0.0"));
  EXPECT_TRUE(Has(t, "specula:admission_rejected_total{" + kLabels + ",reason=\"draining\"} 0.0"));
  EXPECT_FALSE(Has(t, "admission_rejected_total{" + kLabels + ",reason=\"ttft_slo\"}"));
  m.OnRejected("queue_len");
  m.OnRejected("queue_len");
  m.OnRejected("ttft_slo");
  t = m.Render({});
  EXPECT_TRUE(Has(t, "specula:admission_rejected_total{" + kLabels + ",reason=\"queue_len\"} 2.0"));
  EXPECT_TRUE(Has(t, "specula:admission_rejected_total{" + kLabels + ",reason=\"ttft_slo\"} 1.0"));
  EXPECT_TRUE(Has(t, "specula:admission_rejected_total{" + kLabels + ",reason=\"draining\"} 0.0"));
}

// Requests over an admission limit by the path that answered them: every admission reason shown at 0
// for each path the server has (refuse alone, or refuse and faq), then counted apart.
TEST(MetricsTest, DegradedRequestsCountedByReasonAndPath) {
  const std::string refuse_only = ServingMetrics("m", {}).Render({});
  EXPECT_TRUE(Has(refuse_only, "# TYPE specula:admission_degraded_total counter"));
  for (const char* reason : {"queue_len", "queue_delay", "ttft_slo"}) {
    EXPECT_TRUE(Has(refuse_only, "specula:admission_degraded_total{" + kLabels + ",reason=\"" + reason +
                                     "\",path=\"refuse\"} 0.0"));
  }
  EXPECT_EQ(refuse_only.find("path=\"faq\""), std::string::npos);
  ServingMetrics m("m", {}, {.degrade_paths = {"refuse", "faq"}});
  m.OnDegraded("ttft_slo", "faq");
  m.OnDegraded("ttft_slo", "faq");
  m.OnDegraded("queue_len", "refuse");
  const std::string t = m.Render({});
  EXPECT_TRUE(Has(t, "specula:admission_degraded_total{" + kLabels + ",reason=\"ttft_slo\",path=\"faq\"} 2.0"));
  EXPECT_TRUE(Has(t, "specula:admission_degraded_total{" + kLabels + ",reason=\"ttft_slo\",path=\"refuse\"} 0.0"));
  EXPECT_TRUE(Has(t, "specula:admission_degraded_total{" + kLabels + ",reason=\"queue_len\",path=\"refuse\"} 1.0"));
  EXPECT_TRUE(Has(t, "specula:admission_degraded_total{" + kLabels + ",reason=\"queue_delay\",path=\"faq\"} 0.0"));
}

// --model-version: a label on every series, after model_name; none without a version.
TEST(MetricsTest, ModelVersionLabelsEverySeries) {
  ServingMetrics m("m", {"queue_len"}, {.max_model_len = 64, .replica_id = "r", .model_version = "q8-0.v2"});
  m.OnFinished(Finished(FinishReason::kMaxTokens, 12, {1010, 1020}, 1030));
  int samples = 0;
  for (const std::string& l : Lines(m.Render({}))) {
    if (l.empty() || l[0] == '#') continue;
    ++samples;
    EXPECT_NE(l.find("{model_name=\"m\",model_version=\"q8-0.v2\",engine=\"0\""), std::string::npos) << l;
  }
  EXPECT_GT(samples, 100);
  EXPECT_EQ(ServingMetrics("m", {}).Render({}).find("model_version"), std::string::npos);
}

// --replica-id's gauge: 1, the id in its replica label, HELP and TYPE; none without an id.
TEST(MetricsTest, ReplicaInfoNamesTheReplica) {
  const std::string t = ServingMetrics("m", {}, {.replica_id = "host-a:8000"}).Render({});
  EXPECT_TRUE(Has(t, "# HELP specula:replica_info The replica's id (--replica-id); join on it to compare replicas."))
      << t;
  EXPECT_TRUE(Has(t, "# TYPE specula:replica_info gauge"));
  EXPECT_TRUE(Has(t, "specula:replica_info{" + kLabels + ",replica=\"host-a:8000\"} 1.0"));
  EXPECT_EQ(ServingMetrics("m", {}).Render({}).find("replica_info"), std::string::npos);
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  ServingMetrics m("a\"b\\c\nd", {});
  m.OnRejected("x\"y");
  const std::string t = m.Render({});
  EXPECT_TRUE(Has(t, "specula:num_requests_running{model_name=\"a\\\"b\\\\c\\nd\",engine=\"0\"} 0.0")) << t;
  EXPECT_NE(t.find(",reason=\"x\\\"y\"} 1.0"), std::string::npos);
}

TEST(MetricsTest, EveryLineIsACommentOrASample) {
  ServingMetrics m("org/model \"q\"\\", {"queue_len"}, {.max_model_len = 4096, .replica_id = "host/r@1:8000"});
  m.OnFinished(Finished(FinishReason::kMaxTokens, 12, {1010, 1020, 1020}, 1030));
  m.OnRejected("new\nline");
  EngineSnapshot s;
  s.kv_blocks_used = 1;
  s.kv_blocks_total = 3;
  s.stats.spec.accepted_per_position = {1, 0};
  const std::string t = m.Render(s);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back(), '\n');
  const std::string name = "[a-zA-Z_:][a-zA-Z0-9_:]*";
  const std::string label = "[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\\\n]|\\\\[\\\\\"n])*\"";
  const std::regex comment("# (HELP " + name + " .*|TYPE " + name + " (counter|gauge|histogram))");
  // Values as prometheus_client writes them: 3.0, 0.25, 1e-05, 1.5e+06, +Inf.
  const std::string value = "(-?[0-9]+\\.[0-9]+|-?[0-9](\\.[0-9]+)?e[-+][0-9]+|[-+]Inf|NaN)";
  const std::regex sample(name + "\\{" + label + "(," + label + ")*\\} " + value);
  // Each sample belongs to the family TYPE'd last: the same name (gauges; counters, whose TYPE
  // line names the "_total" series as prometheus_client writes it), or _bucket/_count/_sum.
  std::set<std::string> typed;
  std::string family, type;
  for (const std::string& l : Lines(t)) {
    EXPECT_TRUE(std::regex_match(l, comment) || std::regex_match(l, sample)) << "bad line: " << l;
    if (l.rfind("# TYPE ", 0) == 0) {
      family = l.substr(7, l.find(' ', 7) - 7);
      type = l.substr(l.rfind(' ') + 1);
      EXPECT_TRUE(typed.insert(family).second) << "family typed twice: " << l;
      EXPECT_TRUE(type != "counter" || family.ends_with("_total")) << l;
    } else if (l[0] != '#') {
      const std::string series = l.substr(0, l.find('{'));
      if (type == "histogram") {
        EXPECT_TRUE(series == family + "_bucket" || series == family + "_count" || series == family + "_sum") << l;
      } else {
        EXPECT_EQ(series, family) << l;
      }
    }
  }
  EXPECT_EQ(typed.size(), 42u);  // 4 gauges (replica_info), 28 counters (13 of the KV store), 10 histograms
}

TEST(MetricsTest, RecordingFromManyThreadsWhileRendering) {
  ServingMetrics m("m", {"queue_len"});
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&m] {
      for (int j = 0; j < 500; ++j) {
        m.OnFinished(Finished(FinishReason::kStopToken, 2, {1100, 1200}, 1200));
        m.OnRejected("queue_len");
      }
    });
  }
  for (int j = 0; j < 50; ++j) m.Render({});
  for (std::thread& t : threads) t.join();
  const std::string t = m.Render({});
  EXPECT_TRUE(Has(t, "specula:prompt_tokens_total{" + kLabels + "} 4000.0"));
  EXPECT_TRUE(Has(t, "specula:request_success_total{" + kLabels + ",finished_reason=\"stop\"} 2000.0"));
  EXPECT_TRUE(Has(t, "specula:admission_rejected_total{" + kLabels + ",reason=\"queue_len\"} 2000.0"));
  EXPECT_EQ(Value(t, "specula:time_per_output_token_seconds_count{" + kLabels + "}"), 2000);
}

}  // namespace
}  // namespace specula
