// The load generator: schedule, datasets, statistics, the run loop, and the gRPC and HTTP clients
// (the only part that sees gRPC and httplib types).
#include "serving/load_gen.h"

#include <httplib.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "serving/openai_constraints.h"
#include "serving/replica.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

absl::StatusOr<std::vector<LoadRequest>> LoadJsonlDataset(const std::string& path, int32_t default_max_tokens) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<LoadRequest> out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", what));
    };
    // In order: a schema in the line keeps its properties' order.
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    if (!j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty()) {
      return bad("field 'prompt' must be a non-empty string");
    }
    LoadRequest r;
    r.prompt = j["prompt"].get<std::string>();
    r.max_tokens = default_max_tokens;
    if (j.contains("max_tokens")) {
      if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() <= 0 ||
          j["max_tokens"].get<int64_t>() > (1 << 24)) {
        return bad("field 'max_tokens' must be a positive integer");
      }
      r.max_tokens = j["max_tokens"].get<int32_t>();
    }
    if (j.contains("ignore_eos")) {
      if (!j["ignore_eos"].is_boolean()) return bad("field 'ignore_eos' must be true or false");
      r.ignore_eos = j["ignore_eos"].get<bool>();
    }
    if (j.contains("priority")) {
      if (!j["priority"].is_number_integer() || std::abs(j["priority"].get<int64_t>()) > (1 << 30)) {
        return bad("field 'priority' must be an integer");
      }
      r.priority = j["priority"].get<int32_t>();
    }
    if (j.contains("tools") || j.contains("functions")) {
      return bad("field 'tools': tool calls are chat's, and load datasets send completions");
    }
    if (absl::Status st = ParseConstraintFields(j, &r.constraint); !st.ok()) {
      return bad(std::string(st.message()).c_str());
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return out;
}

std::vector<LoadRequest> SyntheticDataset(int32_t n, int32_t input_len, int32_t output_len, int32_t vocab_size,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5eed'da7a'5e7ULL);  // not the arrival stream's seed
  std::uniform_int_distribution<int32_t> id(0, std::max(vocab_size, 1) - 1);
  std::vector<LoadRequest> out(std::max(n, 0));
  for (LoadRequest& r : out) {
    r.prompt_token_ids.resize(input_len);
    for (int32_t& t : r.prompt_token_ids) t = id(rng);
    r.max_tokens = output_len;
    r.ignore_eos = true;
  }
  return out;
}

std::string ConversationPrompt(const std::vector<LoadMessage>& messages) {
  std::string out;
  for (const LoadMessage& m : messages) absl::StrAppend(&out, out.empty() ? "" : "\n", m.content);
  return out;
}

// ---- Statistics (ParseGoodput, Percentile: core/stats.cc).

namespace {

// The first `bytes` of an error, not splitting a UTF-8 character (the JSON that carries it must stay
// valid UTF-8).
std::string ErrorKey(const std::string& error, size_t bytes) {
  if (error.size() <= bytes) return error;
  size_t end = bytes;
  while (end > 0 && (static_cast<unsigned char>(error[end]) & 0xC0) == 0x80) --end;  // a continuation byte
  return error.substr(0, end);
}

// The request's share of the per-replica counts and of the failures by cause.
void CountByReplicaAndCause(const RequestResult& r, BenchSummary* s) {
  if (r.outcome == Outcome::kFailed) ++s->failed_by_error[ErrorKey(r.error, BenchSummary::kErrorKeyBytes)];
  if (r.replica.empty()) {
    ++s->without_replica;
    return;
  }
  BenchSummary::ReplicaCounts& c = s->replicas[r.replica];
  ++c.requests;
  ++(r.outcome == Outcome::kOk ? c.ok : r.outcome == Outcome::kRejected ? c.rejected : c.failed);
}

}  // namespace

BenchSummary Summarize(const RunResult& run, const GoodputSlo& slo) {
  BenchSummary s;
  s.duration_s = run.duration_s;
  std::vector<double> ttft, tpot, itl, e2el, rejection;
  int64_t messages = 0;
  for (const RequestResult& r : run.requests) {
    CountByReplicaAndCause(r, &s);
    if (r.outcome == Outcome::kRejected) {
      ++s.rejected;
      rejection.push_back(r.e2e_s * 1e3);
      continue;
    }
    if (r.outcome == Outcome::kFailed) {
      ++s.failed;
      if (s.first_errors.size() < 5 && std::find(s.first_errors.begin(), s.first_errors.end(), r.error) ==
                                           s.first_errors.end()) {
        s.first_errors.push_back(r.error);
      }
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2e_s * 1e3);
    double tpot_ms = 0;  // as vLLM: a one-token request meets any TPOT goal
    if (r.output_tokens > 1) {
      tpot_ms = (r.e2e_s - r.ttft_s) * 1e3 / (r.output_tokens - 1);
      tpot.push_back(tpot_ms);
    }
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    messages += static_cast<int64_t>(r.itl_s.size()) + (r.output_tokens > 0 ? 1 : 0);
    if (slo.Met(r.ttft_s * 1e3, tpot_ms, r.e2e_s * 1e3)) ++s.good;
  }
  if (s.duration_s > 0) {
    s.request_throughput = s.completed / s.duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / s.duration_s;
    s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / s.duration_s;
    s.request_goodput = s.good / s.duration_s;
  }
  s.ttft_ms = Summarize(std::move(ttft));
  s.tpot_ms = Summarize(std::move(tpot));
  s.itl_ms = Summarize(std::move(itl));
  s.e2el_ms = Summarize(std::move(e2el));
  s.rejection_ms = Summarize(std::move(rejection));
  s.tokens_per_message = messages > 0 ? static_cast<double>(s.total_output_tokens) / messages : 0;
  return s;
}

void SseParser::Feed(std::string_view chunk, const std::function<void(std::string_view data)>& on_data) {
  pending_.append(chunk);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.starts_with("data:")) continue;
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    on_data(line);
  }
  pending_.erase(0, start);
}

// ---- The run: this thread sleeps until each arrival and queues it; a pool of `workers` threads
// sends them, so the pool size is the concurrency limit (vLLM's semaphore).

RunResult RunLoad(LoadClient& client, const std::vector<LoadRequest>& requests, const std::vector<double>& arrivals,
                  const RunOptions& opt) {
  const int32_t n = static_cast<int32_t>(std::min(requests.size(), arrivals.size()));
  RunResult run;
  run.requests.resize(n);
  if (n == 0) return run;
  const int32_t workers = std::min(n, opt.max_concurrency > 0 ? opt.max_concurrency : kMaxInFlightDefault);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int32_t> ready;
  bool closed = false;
  int32_t done = 0;
  Clock::time_point t0;  // set after the threads start; read by a worker only after a queue pop
  std::vector<std::thread> pool;
  for (int32_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (;;) {
        int32_t i;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return closed || !ready.empty(); });
          if (ready.empty()) return;
          i = ready.front();
          ready.pop_front();
        }
        const double sent = Since(t0);
        RequestResult r = client.Send(requests[i]);
        r.send_s = sent;
        const double end = Since(t0);
        std::lock_guard lock(mu);
        run.requests[i] = std::move(r);
        run.duration_s = std::max(run.duration_s, end);
        run.max_send_lag_s = std::max(run.max_send_lag_s, sent - arrivals[i]);
        if (opt.on_progress) opt.on_progress(++done, n);
      }
    });
  }
  t0 = Clock::now();
  run.start_s = std::chrono::duration<double>(t0.time_since_epoch()).count();
  for (int32_t i = 0; i < n; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(arrivals[i])));
    {
      std::lock_guard lock(mu);
      ready.push_back(i);
    }
    cv.notify_one();
  }
  {
    std::lock_guard lock(mu);
    closed = true;
  }
  cv.notify_all();
  for (std::thread& t : pool) t.join();
  return run;
}

// ---- gRPC: one shared channel (HTTP/2 multiplexes the streams), a sync streaming read per request.

namespace {

// A dataset line's constraint as gRPC's `constraint` and as vLLM's structured_outputs (a schema as
// its text, so that its properties keep their order).
void SetConstraint(const ConstraintSpec& c, v1::Constraint* out) {
  using Kind = ConstraintSpec::Kind;
  switch (c.kind) {
    case Kind::kJsonSchema: out->set_json_schema(c.text); break;
    case Kind::kRegex: out->set_regex(c.text); break;
    case Kind::kGrammar: out->set_grammar(c.text); break;
    case Kind::kChoice: for (const std::string& s : c.choices) out->mutable_choice()->add_values(s); break;
    case Kind::kJsonObject: out->set_json_object(true); break;
    case Kind::kStructuralTag: out->set_structural_tag(c.text); break;
    case Kind::kNone: break;
  }
}

json StructuredOutputs(const ConstraintSpec& c) {
  using Kind = ConstraintSpec::Kind;
  switch (c.kind) {
    case Kind::kJsonSchema: return {{"json", c.text}};
    case Kind::kRegex: return {{"regex", c.text}};
    case Kind::kGrammar: return {{"grammar", c.text}};
    case Kind::kChoice: return {{"choice", c.choices}};
    case Kind::kJsonObject: return {{"json_object", true}};
    case Kind::kStructuralTag: return {{"structural_tag", c.text}};
    case Kind::kNone: break;
  }
  return json::object();
}

class GrpcClient final : public LoadClient {
 public:
  GrpcClient(const std::string& target, const ClientOptions& opt)
      : stub_(v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))), opt_(opt) {}

  absl::Status Probe(const std::string& endpoint) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!opt_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + opt_.api_key);
    v1::ModelInfoResponse info;
    const grpc::Status st = stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info);
    if (!st.ok()) return absl::UnavailableError(absl::StrCat("cannot reach ", endpoint, ": ", st.error_message()));
    info_.model = info.model();
    info_.vocab_size = info.vocab_size();
    return absl::OkStatus();
  }

  const ServerInfo& info() const override { return info_; }

  RequestResult Send(const LoadRequest& r) override {
    v1::GenerateRequest q;
    if (!r.messages.empty()) {
      q.set_prompt(ConversationPrompt(r.messages));
    } else if (r.prompt_token_ids.empty()) {
      q.set_prompt(r.prompt);
    }
    for (int32_t t : r.prompt_token_ids) q.add_prompt_token_ids(t);
    q.mutable_sampling()->set_temperature(static_cast<float>(opt_.temperature));
    q.mutable_sampling()->set_max_tokens(r.max_tokens);
    q.mutable_sampling()->set_ignore_eos(r.ignore_eos);
    q.set_priority(r.priority);
    SetConstraint(r.constraint, q.mutable_constraint());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(opt_.request_timeout_s * 1e6)));
    if (!r.session.id.empty()) ctx.AddMetadata("x-session-id", r.session.id);
    if (!opt_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + opt_.api_key);
    RequestResult res;
    const Clock::time_point t0 = Clock::now();
    double last = 0;
    bool aborted = false;  // the server stopped it (cancelled, deadline, shutdown): not a completion
    auto reader = stub_->Generate(&ctx, q);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      const double t = Since(t0);
      if (m.token_ids_size() > 0) {
        if (res.output_tokens == 0) res.ttft_s = t; else res.itl_s.push_back(t - last);
        last = t;
        res.output_tokens += m.token_ids_size();
      }
      if (!r.messages.empty()) res.text += m.text();
      if (m.has_usage()) {
        res.prompt_tokens = m.usage().prompt_tokens();
        res.cached_tokens = m.usage().cached_prompt_tokens();
      }
      aborted = aborted || m.finish_reason() == v1::FINISH_REASON_ABORTED;
    }
    const grpc::Status st = reader->Finish();
    res.e2e_s = Since(t0);
    // Finish has received the initial metadata if no read did (empty where the call never reached a
    // server).
    const auto& initial = ctx.GetServerInitialMetadata();
    for (auto [key, dst] : {std::pair{kReplicaMetadata, &res.replica}, {kAnsweredByMetadata, &res.answered_by},
                            {kModelVersionMetadata, &res.model_version}}) {
      if (const auto it = initial.find(key); it != initial.end()) dst->assign(it->second.data(), it->second.size());
    }
    if (res.prompt_tokens == 0) res.prompt_tokens = static_cast<int32_t>(r.prompt_token_ids.size());
    res.outcome = st.ok() ? Outcome::kOk
                  : st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? Outcome::kRejected : Outcome::kFailed;
    if (!st.ok()) {
      res.error = absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())), ": ",
                               st.error_message());
    } else if (aborted) {
      res.outcome = Outcome::kFailed;
      res.error = "finish_reason ABORTED";
    }
    return res;
  }

 private:
  std::unique_ptr<v1::Generation::Stub> stub_;
  ClientOptions opt_;
  ServerInfo info_;
};

// ---- HTTP: a fresh connection per request (Connection: close). The server gives each open
// connection a thread, so idle keep-alive connections from a pool would hold its threads; a loopback
// connect costs ~0.1 ms, inside the measured TTFT as for a cold client.

std::string HttpError(httplib::Error e) {  // httplib's own names are single words ("Connection")
  switch (e) {
    case httplib::Error::Connection: return "could not connect (connection refused or unreachable)";
    case httplib::Error::ConnectionTimeout: return "connect timed out";
    case httplib::Error::Read: return "read failed or timed out";
    case httplib::Error::Write: return "write failed";
    default: return httplib::to_string(e);
  }
}

std::string ErrorMessage(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

// What one streamed response says, event by event: its timing, usage and text (completions' `text`,
// chat's `delta.content`).
struct EventStream {
  explicit EventStream(bool chat) : chat(chat) {}

  void Usage(const json& u) {
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) res.prompt_tokens = u["prompt_tokens"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) usage_tokens = u["completion_tokens"];
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      const json& d = u["prompt_tokens_details"];
      if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()) res.cached_tokens = d["cached_tokens"];
    }
  }

  // One `data:` payload, `t` seconds after the send.
  void Event(std::string_view payload, double t) {
    if (payload == "[DONE]") {
      finished = true;
      return;
    }
    const json j = json::parse(payload, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      error = absl::StrCat("bad event data: ", std::string(payload.substr(0, 100)));
      return;
    }
    if (j.contains("error")) error = ErrorMessage(std::string(payload));
    if (j.contains("usage") && j["usage"].is_object()) Usage(j["usage"]);
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
    const json& c0 = j["choices"][0];
    if (c0.contains("finish_reason") && c0["finish_reason"] == "abort") error = "finish_reason abort";
    const json* text = nullptr;
    if (!chat && c0.contains("text")) text = &c0["text"];
    const bool delta = chat && c0.contains("delta") && c0["delta"].is_object();
    if (delta && c0["delta"].contains("content")) text = &c0["delta"]["content"];
    const bool empty = text == nullptr || !text->is_string() || text->get<std::string>().empty();
    if (!empty && chat) res.text += text->get<std::string>();
    // An empty text with a finish_reason only closes the stream, and chat's opening delta with its
    // role and no content only opens it; other chunks carry tokens (an empty text can be a token
    // that is not a whole UTF-8 character yet).
    if (empty && c0.contains("finish_reason") && !c0["finish_reason"].is_null()) return;
    if (empty && delta && c0["delta"].contains("role")) return;
    if (messages++ == 0) res.ttft_s = t; else res.itl_s.push_back(t - last);
    last = t;
  }

  const bool chat;
  RequestResult res;
  int messages = 0, usage_tokens = -1;
  bool finished = false;
  std::string error;
  double last = 0;
};

class HttpClient final : public LoadClient {
 public:
  HttpClient(std::string host, int port, const ClientOptions& opt) : host_(std::move(host)), port_(port), opt_(opt) {}

  absl::Status Probe(const std::string& endpoint) {
    httplib::Client c(host_, port_);
    c.set_connection_timeout(10);
    c.set_read_timeout(10);
    httplib::Headers auth;
    if (!opt_.api_key.empty()) auth.emplace("Authorization", "Bearer " + opt_.api_key);
    const auto res = c.Get("/v1/models", auth);
    if (!res) return absl::UnavailableError(absl::StrCat("cannot reach ", endpoint, ": ", HttpError(res.error())));
    if (res->status != 200) {
      return absl::UnavailableError(absl::StrCat(endpoint, ": GET /v1/models: HTTP ", res->status, ": ",
                                                 ErrorMessage(res->body)));
    }
    info_.model = opt_.model;
    if (!info_.model.empty()) return absl::OkStatus();
    const json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
      return absl::FailedPreconditionError(absl::StrCat(endpoint, ": GET /v1/models has no data[0].id; pass --model"));
    }
    info_.model = j["data"][0]["id"].get<std::string>();
    return absl::OkStatus();
  }

  const ServerInfo& info() const override { return info_; }

  // A streamed /v1/completions request for `r`, or /v1/chat/completions for a conversation's.
  httplib::Request CompletionRequest(const LoadRequest& r) const {
    json body = {{"model", info_.model}, {"temperature", opt_.temperature}, {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (!r.messages.empty()) {
      body["messages"] = json::array();
      for (const LoadMessage& m : r.messages) body["messages"].push_back({{"role", m.role}, {"content", m.content}});
    } else if (r.prompt_token_ids.empty()) {
      body["prompt"] = r.prompt;
    } else {
      body["prompt"] = r.prompt_token_ids;
    }
    if (r.max_tokens > 0) body["max_tokens"] = r.max_tokens;
    if (r.ignore_eos) body["ignore_eos"] = true;
    if (r.priority != 0) body["priority"] = r.priority;
    if (r.constraint.active()) body["structured_outputs"] = StructuredOutputs(r.constraint);
    httplib::Request q;
    q.method = "POST";
    q.path = r.messages.empty() ? "/v1/completions" : "/v1/chat/completions";
    q.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
    if (!r.session.id.empty()) q.headers.emplace("X-Session-Id", r.session.id);
    if (!opt_.api_key.empty()) q.headers.emplace("Authorization", "Bearer " + opt_.api_key);
    q.body = body.dump();
    return q;
  }

  RequestResult Send(const LoadRequest& r) override {
    httplib::Client c(host_, port_);
    c.set_connection_timeout(10);
    const auto timeout = std::chrono::microseconds(static_cast<int64_t>(opt_.request_timeout_s * 1e6));
    c.set_read_timeout(timeout);
    c.set_write_timeout(timeout);
    httplib::Request q = CompletionRequest(r);

    EventStream events(!r.messages.empty());
    int status = 0;
    std::string error_body;
    SseParser sse;
    const Clock::time_point t0 = Clock::now();
    q.response_handler = [&](const httplib::Response& h) {
      status = h.status;
      events.res.replica = h.get_header_value(kReplicaHeader);  // httplib's header names ignore case
      events.res.answered_by = h.get_header_value(kAnsweredByHeader);
      events.res.model_version = h.get_header_value(kModelVersionHeader);
      return true;
    };
    q.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status != 200) {
        error_body.append(data, n);
        return true;
      }
      const double t = Since(t0);
      sse.Feed(std::string_view(data, n), [&](std::string_view payload) { events.Event(payload, t); });
      return true;
    };
    const auto result = c.send(q);
    RequestResult& res = events.res;
    res.e2e_s = Since(t0);
    res.output_tokens = events.usage_tokens >= 0 ? events.usage_tokens : events.messages;
    if (res.prompt_tokens == 0) res.prompt_tokens = static_cast<int32_t>(r.prompt_token_ids.size());
    res.outcome = Outcome::kFailed;
    if (!result) {
      res.error = absl::StrCat("HTTP: ", HttpError(result.error()));
    } else if (status != 200) {
      res.outcome = status == 429 ? Outcome::kRejected : Outcome::kFailed;
      res.error = absl::StrCat("HTTP ", status, ": ", ErrorMessage(error_body.empty() ? result->body : error_body));
    } else if (!events.error.empty()) {
      res.error = events.error;
    } else if (!events.finished) {
      res.error = "the stream ended before data: [DONE]";
    } else {
      res.outcome = Outcome::kOk;
    }
    return std::move(res);
  }

 private:
  std::string host_;
  int port_;
  ClientOptions opt_;
  ServerInfo info_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LoadClient>> ConnectLoadClient(const std::string& endpoint, const ClientOptions& opt) {
  const size_t sep = endpoint.find("://");
  const std::string scheme = sep == std::string::npos ? "" : endpoint.substr(0, sep);
  std::string hostport = sep == std::string::npos ? "" : endpoint.substr(sep + 3);
  if (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  const size_t colon = hostport.rfind(':');
  int port = 0;
  if ((scheme != "grpc" && scheme != "http") || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(hostport.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--endpoint: '", endpoint, "' is not grpc://HOST:PORT or http://HOST:PORT"));
  }
  if (scheme == "grpc") {
    auto c = std::make_unique<GrpcClient>(hostport, opt);
    if (auto st = c->Probe(endpoint); !st.ok()) return st;
    return std::unique_ptr<LoadClient>(std::move(c));
  }
  std::string host = hostport.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  auto c = std::make_unique<HttpClient>(host, port, opt);
  if (auto st = c->Probe(endpoint); !st.ok()) return st;
  return std::unique_ptr<LoadClient>(std::move(c));
}

}  // namespace specula
