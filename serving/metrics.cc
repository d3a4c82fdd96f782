#include "serving/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "request/finish.h"

namespace specula {
namespace {

// vLLM's buckets (vllm/v1/metrics/loggers.py, see metrics.h). kLatencyBuckets is its
// request_latency_buckets: e2e latency and the queue, prefill, decode and inference phases.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTpotBuckets = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
                                          0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,  15.0,  20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// Ours: an FAQ answer is a lookup and a few hundred bytes, so its buckets resolve milliseconds.
const std::vector<double> kFaqAnswerBuckets = {0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0};

// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value.
std::vector<double> Buckets125(int64_t max_value) {
  std::vector<double> b;
  for (int64_t scale = 1; max_value > 0; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return b;
      b.push_back(static_cast<double>(m * scale));
    }
  }
  return b;
}

// A number as prometheus_client's floatToGoString writes it: Python's repr ("3.0", "0.001",
// "1e-05"), except that Go's exponent form starts at 1e+06 ("1e+06", "2.5e+07"), and "+Inf".
std::string GoFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Python's repr: the shortest round-trip digits, in exponent form below 1e-4 and from 1e16 on.
  char* end = std::to_chars(buf, buf + sizeof buf - 1, d, std::chars_format::scientific).ptr;
  *end = '\0';  // atoi below reads to a terminator
  const int exp10 = std::atoi(std::find(buf, end, 'e') + 1);
  if (d != 0 && (exp10 < -4 || exp10 >= 16)) return std::string(buf, end);
  std::string s(buf, std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed).ptr);
  size_t dot = s.find('.');
  if (dot == std::string::npos) {
    dot = s.size();
    s += ".0";
  }
  if (d > 0 && dot > 6) {  // 1234567.0 -> 1.234567e+06
    std::string mantissa = s.substr(0, 1) + "." + s.substr(1, dot - 1) + s.substr(dot + 1);
    while (!mantissa.empty() && (mantissa.back() == '0' || mantissa.back() == '.')) mantissa.pop_back();
    return mantissa + "e+" + (dot - 1 < 10 ? "0" : "") + std::to_string(dot - 1);
  }
  return s;
}

// A label value in double quotes, with backslash, quote and newline escaped (format 0.0.4).
std::string Quote(const std::string& v) {
  std::string q = "\"";
  for (char c : v) {
    if (c == '\\') q += "\\\\";
    else if (c == '"') q += "\\\"";
    else if (c == '\n') q += "\\n";
    else q += c;
  }
  return q + "\"";
}

// Writes the families. `base` is the labels every series carries: model_name="...",engine="0".
class Writer {
 public:
  explicit Writer(std::string base) : base_(std::move(base)) {}

  // HELP and TYPE lines. A counter's carry its samples' name, "_total" included: that is what
  // prometheus_client writes (and vLLM serves), and its parser then yields family `x` with samples
  // `x_total`; a TYPE line without "_total" leaves the samples outside the family, untyped.
  void Family(const std::string& name, const std::string& type, const char* help) {
    const std::string n = "specula:" + name + (type == "counter" ? "_total" : "");
    out_ += "# HELP " + n + " " + help + "\n# TYPE " + n + " " + type + "\n";
  }
  void Sample(const std::string& name, double value, const std::string& extra = "") {
    out_ += "specula:" + name + "{" + base_ + extra + "} " + GoFloat(value) + "\n";
  }
  void Gauge(const std::string& name, const char* help, double value) {
    Family(name, "gauge", help);
    Sample(name, value);
  }
  void Counter(const std::string& name, const char* help, double value) {
    Family(name, "counter", help);
    Sample(name + "_total", value);
  }
  template <typename H>
  void Histogram(const std::string& name, const char* help, const H& h) {
    Family(name, "histogram", help);
    int64_t cumulative = 0;
    for (size_t i = 0; i <= h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      const double le = i < h.bounds.size() ? h.bounds[i] : INFINITY;
      Sample(name + "_bucket", static_cast<double>(cumulative), ",le=" + Quote(GoFloat(le)));
    }
    Sample(name + "_count", static_cast<double>(h.count));
    Sample(name + "_sum", h.sum);
  }
  std::string Take() { return std::move(out_); }

 private:
  const std::string base_;
  std::string out_;
};

// The shared KV store's counters (--kv-store; all zero without one): the store's, as the I/O thread
// counts them (kvstore/kv_transfer.h), and the engine's installs of what it fetched.
void WriteKvStore(const EngineStats& e, Writer& w) {
  const KvStoreStats& k = e.kv_store;
  w.Counter("kv_store_fetches", "Fetches of a request's missing prompt blocks from the shared KV store.",
            static_cast<double>(k.fetches));
  w.Counter("kv_store_hit_blocks", "Blocks the shared KV store had, in the run from each fetch's first key.",
            static_cast<double>(k.hit_blocks));
  w.Counter("kv_store_miss_blocks",
            "Blocks fetched and not found: each answered fetch's first missing block and those after it.",
            static_cast<double>(k.miss_blocks));
  w.Counter("kv_store_read_bytes", "Bytes of block values read from the shared KV store.",
            static_cast<double>(k.read_bytes));
  w.Counter("kv_store_written_bytes", "Bytes of block values written to the shared KV store.",
            static_cast<double>(k.written_bytes));
  w.Counter("kv_store_writes", "Blocks written to the shared KV store.", static_cast<double>(k.writes));
  w.Counter("kv_store_dropped_writes",
            "Block writes dropped: past --kv-store-max-pending-mb, or lost to a failed round trip.",
            static_cast<double>(k.dropped_writes));
  w.Counter("kv_store_timeouts", "Shared KV store commands that passed --kv-store-timeout-ms.",
            static_cast<double>(k.timeouts));
  w.Counter("kv_store_errors", "Shared KV store failures other than timeouts (connection, error replies).",
            static_cast<double>(k.errors));
  w.Counter("kv_store_fetch_seconds", "Seconds from each fetch's request to its result, summed.", k.fetch_seconds);
  w.Counter("kv_store_installed_blocks", "Fetched blocks installed into the local KV pool as cached blocks.",
            static_cast<double>(e.kv_installed_blocks));
  w.Counter("kv_store_rejected_blocks",
            "Fetched blocks refused (a bad checksum, header or tokens) and computed instead.",
            static_cast<double>(e.kv_rejected_blocks));
  w.Counter("kv_store_install_seconds", "Seconds the engine's thread spent installing fetched blocks.",
            e.kv_install_seconds);
}

}  // namespace

void ServingMetrics::Histogram::Observe(double v) {
  // Buckets are upper-inclusive (le): v lands in the first bound >= v, else in +Inf.
  counts[std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin()] += 1;
  sum += v;
  ++count;
}

ServingMetrics::ServingMetrics(std::string model_name, std::vector<std::string> rejection_reasons, Options options)
    : model_name_(std::move(model_name)),
      replica_id_(std::move(options.replica_id)),
      model_version_(std::move(options.model_version)),
      token_histograms_(options.max_model_len > 0),
      ttft_(kTtftBuckets),
      itl_(kTpotBuckets),
      e2e_(kLatencyBuckets),
      prompt_len_(Buckets125(options.max_model_len)),
      generation_len_(Buckets125(options.max_model_len)),
      queue_(kLatencyBuckets),
      prefill_(kLatencyBuckets),
      decode_(kLatencyBuckets),
      inference_(kLatencyBuckets),
      faq_answer_(kFaqAnswerBuckets) {
  for (const std::string& r : rejection_reasons) rejected_[r] = 0;
  for (const char* reason : {"queue_len", "queue_delay", "ttft_slo"}) {
    for (const std::string& path : options.degrade_paths) degraded_[{reason, path}] = 0;
  }
}

void ServingMetrics::OnFinished(const RequestOutput& out) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += out.prompt_tokens;
  generation_tokens_ += static_cast<int64_t>(out.tokens.size());
  // The OpenAI name of the finish (request/finish.h); an error (and kNone) has no finished_reason
  // series, as in vLLM.
  if (out.finish != FinishReason::kError && out.finish != FinishReason::kNone) ++finished_[OpenAiFinishName(out.finish)];
  if (!out.tokens.empty()) ttft_.Observe((out.first_token_ms - out.arrival_ms) / 1000.0);
  // vLLM observes time_per_output_token once per engine output after the first, i.e. per step that
  // brought the request tokens: the time since the previous one. Tokens of one speculative step
  // share a timestamp, so they make one observation, not one plus zeros.
  for (size_t i = 1; i < out.token_ms.size(); ++i) {
    if (out.token_ms[i] != out.token_ms[i - 1]) itl_.Observe((out.token_ms[i] - out.token_ms[i - 1]) / 1000.0);
  }
  e2e_.Observe((out.finish_ms - out.arrival_ms) / 1000.0);
  queue_.Observe(((out.scheduled_ms > 0 ? out.scheduled_ms : out.finish_ms) - out.arrival_ms) / 1000.0);
  if (!out.tokens.empty()) {
    prefill_.Observe((out.first_token_ms - out.scheduled_ms) / 1000.0);
    decode_.Observe((out.token_ms.back() - out.first_token_ms) / 1000.0);
    inference_.Observe((out.token_ms.back() - out.scheduled_ms) / 1000.0);
  }
  prompt_len_.Observe(out.prompt_tokens);
  generation_len_.Observe(static_cast<double>(out.tokens.size()));
}

void ServingMetrics::OnRejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_[reason];
}

void ServingMetrics::OnFaqAnswered(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  faq_answer_.Observe(seconds);
}

void ServingMetrics::SetModelVersion(std::string version) {
  std::lock_guard<std::mutex> lock(mu_);
  model_version_ = std::move(version);
}

void ServingMetrics::OnDegraded(const std::string& reason, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  ++degraded_[{reason, path}];
}

std::string ServingMetrics::RenderFrom(const std::function<EngineSnapshot()>& snapshot) const {
  std::lock_guard<std::mutex> lock(mu_);
  const EngineSnapshot s = snapshot();
  Writer w("model_name=" + Quote(model_name_) +
           (model_version_.empty() ? "" : ",model_version=" + Quote(model_version_)) + ",engine=\"0\"");
  const double kv_usage = s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0;
  if (!replica_id_.empty()) {
    w.Family("replica_info", "gauge", "The replica's id (--replica-id); join on it to compare replicas.");
    w.Sample("replica_info", 1.0, ",replica=" + Quote(replica_id_));
  }
  w.Gauge("num_requests_running", "Number of requests in model execution batches.", s.num_running);
  w.Gauge("num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting);
  w.Gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage);
  w.Counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            static_cast<double>(s.prefix_cache_queries));
  w.Counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            static_cast<double>(s.prefix_cache_hits));
  w.Counter("num_preemptions", "Cumulative number of preemption from the engine.",
            static_cast<double>(s.num_preemptions));

  const SpecStats& spec = s.stats.spec;
  w.Counter("spec_decode_num_drafts", "Number of spec decoding drafts.", static_cast<double>(spec.drafts));
  w.Counter("spec_decode_num_draft_tokens", "Number of draft tokens.", static_cast<double>(spec.draft_tokens));
  w.Counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
            static_cast<double>(spec.accepted_tokens));
  // Structured output's drafts (ours). A grammar forces drafts without a proposer too, so these and
  // the counters above are exported whatever --spec-method says.
  w.Counter("spec_decode_num_forced_draft_tokens",
            "Number of draft tokens forced by a request's grammar (counted in num_draft_tokens too).",
            static_cast<double>(spec.forced_tokens));
  w.Counter("spec_decode_num_accepted_forced_tokens", "Number of accepted forced draft tokens.",
            static_cast<double>(spec.forced_accepted));
  w.Counter("spec_decode_num_grammar_cut_tokens",
            "Number of proposed draft tokens cut where they left a request's grammar (never verified).",
            static_cast<double>(spec.cut_tokens));
  // One series per draft position up to the configured k (spec_k_histogram has k + 1 entries), so
  // positions that never accepted show 0 as vLLM's do.
  const size_t k_max = std::max(s.stats.spec_k_histogram.empty() ? 0 : s.stats.spec_k_histogram.size() - 1,
                                spec.accepted_per_position.size());
  w.Family("spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.");
  for (size_t pos = 0; pos < k_max; ++pos) {
    const int64_t n = pos < spec.accepted_per_position.size() ? spec.accepted_per_position[pos] : 0;
    w.Sample("spec_decode_num_accepted_tokens_per_pos_total", static_cast<double>(n),
             ",position=" + Quote(std::to_string(pos)));
  }

  WriteKvStore(s.stats, w);

  w.Counter("prompt_tokens", "Number of prefill tokens processed.", static_cast<double>(prompt_tokens_));
  w.Counter("generation_tokens", "Number of generation tokens processed.", static_cast<double>(generation_tokens_));
  w.Family("request_success", "counter", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort"}) {  // every series, zero or not
    auto it = finished_.find(reason);
    w.Sample("request_success_total", it == finished_.end() ? 0.0 : static_cast<double>(it->second),
             ",finished_reason=" + Quote(reason));
  }
  w.Histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  w.Histogram("time_per_output_token_seconds", "Histogram of time per output token in seconds.", itl_);
  w.Histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  w.Histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", queue_);
  w.Histogram("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", inference_);
  w.Histogram("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_);
  w.Histogram("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_);
  if (token_histograms_) {
    w.Histogram("request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
    w.Histogram("request_generation_tokens", "Number of generation tokens processed.", generation_len_);
  }
  w.Family("admission_rejected", "counter", "Requests refused by admission control, by reason.");
  for (const auto& [reason, n] : rejected_) {
    w.Sample("admission_rejected_total", static_cast<double>(n), ",reason=" + Quote(reason));
  }
  w.Family("admission_degraded", "counter",
           "Requests over an admission limit, by reason and the path that answered them (refuse or faq).");
  for (const auto& [key, n] : degraded_) {
    w.Sample("admission_degraded_total", static_cast<double>(n), ",reason=" + Quote(key.first) + ",path=" + Quote(key.second));
  }
  w.Histogram("faq_answer_seconds", "Histogram of the time from a request's arrival at a handler to its FAQ answer.",
              faq_answer_);
  return w.Take();
}

}  // namespace specula
