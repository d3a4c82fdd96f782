#include "experiments/spec.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "request/boundary.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace specula::experiments {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::TextFormat;

// Collects the text parser's first error with its position (0-based from the parser).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (message_.empty()) message_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// Where a field of the spec was written: "spec.textproto:LINE:COL: " from the parser's location
// tree, walking message fields by name; a field that was not written points at its closest written
// parent (or line 1). The tree records a repeated field where its name is written, so the element
// `index` of a list (`max_num_seqs: [1, -8]`) is found by scanning the list from there.
class Locator {
 public:
  Locator(std::string path, const TextFormat::ParseInfoTree* tree, const std::string& text)
      : path_(std::move(path)), tree_(tree), text_(text) {}

  std::string At(std::initializer_list<const char*> fields, int index = -1) const {
    const Descriptor* desc = Experiment::descriptor();
    const TextFormat::ParseInfoTree* tree = tree_;
    int line = 0, col = 0;
    size_t i = 0;
    for (const char* name : fields) {
      const FieldDescriptor* fd = desc->FindFieldByName(name);
      if (fd == nullptr || tree == nullptr) break;
      const bool last = ++i == fields.size();
      if (last && fd->is_repeated()) {
        // The last occurrence of the name at or before `index` (`f: 1 f: 2` records each one).
        for (int k = std::max(index, 0); k >= 0; --k) {
          const auto loc = tree->GetLocation(fd, k);
          if (loc.line < 0) continue;
          line = loc.line;
          col = loc.column;
          if (index >= 0) ListElement(index - k, &line, &col);
          break;
        }
        break;
      }
      const auto loc = tree->GetLocation(fd, -1);
      if (loc.line < 0) break;
      line = loc.line;
      col = loc.column;
      if (last || fd->message_type() == nullptr) break;
      tree = tree->GetTreeForNested(fd, -1);
      desc = fd->message_type();
    }
    return absl::StrCat(path_, ":", line + 1, ":", col + 1, ": ");
  }

 private:
  // From a field name at (line, col), 0-based: moves to element `skip` of its `[...]` list, if it
  // has one. Commas inside strings and comments are not separators.
  void ListElement(int skip, int* line, int* col) const {
    size_t pos = 0;
    for (int l = 0; l < *line && pos != std::string::npos; ++l) pos = text_.find('\n', pos) + 1;
    if (pos == std::string::npos || (pos == 0 && *line > 0)) return;
    pos += *col;
    const size_t colon = text_.find(':', pos);
    if (colon == std::string::npos) return;
    size_t p = text_.find_first_not_of(" \t\r\n", colon + 1);
    if (p == std::string::npos || text_[p] != '[') return;
    ++p;
    for (int element = 0;; ++p) {
      p = text_.find_first_not_of(" \t\r\n", p);
      if (p == std::string::npos || text_[p] == ']') return;
      if (element == skip) break;
      // Skip this element: to the next comma at depth 0, outside strings and comments.
      for (; p < text_.size() && text_[p] != ',' && text_[p] != ']'; ++p) {
        if (text_[p] == '"' || text_[p] == '\'') {
          const char quote = text_[p];
          while (++p < text_.size() && text_[p] != quote) p += text_[p] == '\\';
        } else if (text_[p] == '#') {
          p = text_.find('\n', p);
          if (p == std::string::npos) return;
        }
      }
      if (p >= text_.size() || text_[p] == ']') return;
      ++element;
    }
    const size_t line_start = text_.rfind('\n', p - 1);
    *line = static_cast<int>(std::count(text_.begin(), text_.begin() + p, '\n'));
    *col = static_cast<int>(line_start == std::string::npos ? p : p - line_start - 1);
  }

  std::string path_;
  const TextFormat::ParseInfoTree* tree_;
  const std::string& text_;
};

constexpr int32_t kDefaultNumSpecTokens = 4;  // the sweep's k when it names none (as `generate`)

bool Exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

std::string Resolve(const std::string& spec_path, const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  const size_t slash = spec_path.find_last_of('/');
  return slash == std::string::npos ? p : absl::StrCat(spec_path.substr(0, slash + 1), p);
}

std::string Num(double v) { return std::isinf(v) ? (v > 0 ? "inf" : "-inf") : absl::StrFormat("%g", v); }

// No value of a sweep field twice; `show` writes a value as the error shows it.
template <typename Values, typename Show>
absl::Status NoDuplicates(const Locator& at, const char* field, const Values& values, Show show) {
  for (int i = 0; i < values.size(); ++i) {
    for (int j = 0; j < i; ++j) {
      if (values[i] == values[j]) {
        return absl::InvalidArgumentError(absl::StrCat(at.At({"sweep", field}, i), "sweep.", field, "[", i, "]: ",
                                                       show(values[i]), " is listed twice"));
      }
    }
  }
  return absl::OkStatus();
}

std::string Quoted(const std::string& v) { return absl::StrCat("\"", v, "\""); }

absl::Status CheckStrings(const Locator& at, const char* field, const google::protobuf::RepeatedPtrField<std::string>& values,
                          const std::set<std::string>& allowed) {
  for (int i = 0; i < values.size(); ++i) {
    if (!allowed.count(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(at.At({"sweep", field}, i), "sweep.", field, "[", i, "]: ",
                                                     Quoted(values[i]), " is not one of ", absl::StrJoin(allowed, ", ")));
    }
  }
  return NoDuplicates(at, field, values, Quoted);
}

// Each value of a numeric sweep field within [lo, hi].
template <typename T>
absl::Status CheckRange(const Locator& at, const char* field, const google::protobuf::RepeatedField<T>& values, double lo,
                        double hi) {
  for (int i = 0; i < values.size(); ++i) {
    const double v = static_cast<double>(values[i]);
    if (!(v >= lo && v <= hi)) {
      return absl::InvalidArgumentError(absl::StrCat(at.At({"sweep", field}, i), "sweep.", field, "[", i, "]: ", Num(v),
                                                     " is not in [", Num(lo), ", ", Num(hi), "]"));
    }
  }
  return NoDuplicates(at, field, values, [](T v) { return Num(static_cast<double>(v)); });
}

// Also reads the prompts file into `prompts`.
// An error at the spec's `fields` (the index-th element of a repeated one).
absl::Status Bad(const Locator& at, std::initializer_list<const char*> fields, const std::string& msg, int index = -1) {
  return absl::InvalidArgumentError(absl::StrCat(at.At(fields, index), msg));
}

// The files, the workload (its prompts read into *prompts), repeats and SLO.
absl::Status ValidateInputs(const Locator& at, const Experiment& s, const std::string& spec_path,
                            std::vector<LoadRequest>* prompts) {
  auto bad = [&](std::initializer_list<const char*> fields, const std::string& msg) { return Bad(at, fields, msg); };
  // Files.
  if (s.model().path().empty()) return bad({"model"}, "model.path is required");
  struct FileField {
    const char* message;
    const char* field;
    const std::string& value;
  };
  for (const FileField& f : {FileField{"model", "path", s.model().path()}, FileField{"model", "tokenizer", s.model().tokenizer()},
                             FileField{"draft", "path", s.draft().path()},
                             FileField{"workload", "prompts_file", s.workload().prompts_file()}}) {
    if (!f.value.empty() && !Exists(Resolve(spec_path, f.value))) {
      return bad({f.message, f.field}, absl::StrCat(f.message, ".", f.field, ": ", Resolve(spec_path, f.value), " does not exist"));
    }
  }
  const std::string& device = s.model().device();
  if (!device.empty() && device != "cpu" && device != "cuda") {
    return bad({"model", "device"}, absl::StrCat("model.device: '", device, "' is not cpu or cuda"));
  }
  const std::string& dtype = s.model().dtype();
  if (!dtype.empty() && !ParseDType(dtype).ok()) {
    return bad({"model", "dtype"}, absl::StrCat("model.dtype: '", dtype, "' is not f32, bf16 or f16"));
  }
  if (!s.endpoint().empty() && (!device.empty() || !dtype.empty())) {
    return bad({"model", "device"}, "model.device and model.dtype are for local points: an endpoint's server chose its own");
  }
  // Workload.
  const v1::Workload& w = s.workload();
  if (w.source_case() == v1::Workload::SOURCE_NOT_SET) {
    return bad({"workload"}, "workload needs prompts_file, synthetic { input_len output_len } or conversation { ... }");
  }
  if (w.has_synthetic() && (w.synthetic().input_len() <= 0 || w.synthetic().output_len() <= 0)) {
    return bad({"workload", "synthetic"}, absl::StrCat("workload.synthetic: input_len and output_len must be positive, got ",
                                                       w.synthetic().input_len(), " and ", w.synthetic().output_len()));
  }
  if (w.num_requests() < 0 || w.num_requests() > 1000000) {
    return bad({"workload", "num_requests"}, absl::StrCat("workload.num_requests: ", w.num_requests(), " is not in [1, 1000000]"));
  }
  if (w.max_tokens() < 0) return bad({"workload", "max_tokens"}, absl::StrCat("workload.max_tokens: ", w.max_tokens(), " is negative"));
  if (!w.prompts_file().empty()) {
    auto data = LoadJsonlDataset(Resolve(spec_path, w.prompts_file()),
                                 w.max_tokens() > 0 ? w.max_tokens() : kWorkloadMaxTokensDefault);
    if (!data.ok()) return bad({"workload", "prompts_file"}, absl::StrCat("workload.prompts_file: ", data.status().message()));
    if (data->empty()) return bad({"workload", "prompts_file"}, "workload.prompts_file: the file holds no prompts");
    *prompts = std::move(data).value();
  }
  if (s.repeats() < 0 || s.repeats() > 100) return bad({"repeats"}, absl::StrCat("repeats: ", s.repeats(), " is not in [1, 100]"));
  if (s.max_spec_tokens() < 0 || s.max_spec_tokens() > 64) {
    return bad({"max_spec_tokens"}, absl::StrCat("max_spec_tokens: ", s.max_spec_tokens(), " is not in [1, 64]"));
  }
  for (auto [field, v] : {std::pair{"ttft_ms", s.slo().ttft_ms()}, {"tpot_ms", s.slo().tpot_ms()}, {"e2el_ms", s.slo().e2el_ms()}}) {
    if (!(v >= 0 && std::isfinite(v))) return bad({"slo", field}, absl::StrCat("slo.", field, ": ", Num(v), " is not a duration >= 0"));
  }
  return absl::OkStatus();
}

// The mode, the endpoint and the sweep's values.
absl::Status ValidateSweep(const Locator& at, const Experiment& s) {
  auto bad = [&](std::initializer_list<const char*> fields, const std::string& msg, int index = -1) {
    return Bad(at, fields, msg, index);
  };
  // Mode and endpoint.
  const bool online = s.mode() == v1::ONLINE;
  const v1::Sweep& sw = s.sweep();
  if (!s.endpoint().empty()) {
    if (!online) return bad({"endpoint"}, "endpoint needs mode: ONLINE");
    if (s.endpoint().rfind("grpc://", 0) != 0 && s.endpoint().rfind("http://", 0) != 0) {
      return bad({"endpoint"}, absl::StrCat("endpoint: \"", s.endpoint(), "\" is not grpc://HOST:PORT or http://HOST:PORT"));
    }
    // The server's flags fix its engine: a sweep over them would record settings that never ran.
    for (auto [field, n] : {std::pair{"max_num_seqs", sw.max_num_seqs_size()}, {"spec_method", sw.spec_method_size()},
                            {"num_spec_tokens", sw.num_spec_tokens_size()},
                            {"max_num_batched_tokens", sw.max_num_batched_tokens_size()},
                            {"kv_cache_dtype", sw.kv_cache_dtype_size()}, {"quantization", sw.quantization_size()}}) {
      if (n > 0) {
        return bad({"sweep", field}, absl::StrCat("sweep.", field, ": the server at endpoint fixes it (its own flags); ",
                                                  "with an endpoint the sweep varies temperature, request_rate, burstiness and ",
                                                  "burst_factor only"));
      }
    }
  }
  if (online && sw.request_rate_size() == 0 && !s.workload().has_conversation()) {
    return bad({"sweep"}, "mode: ONLINE needs sweep.request_rate: [...]");
  }
  if (!online) {
    for (auto [field, n] : {std::pair{"request_rate", sw.request_rate_size()}, {"burstiness", sw.burstiness_size()}}) {
      if (n > 0) return bad({"sweep", field}, absl::StrCat("sweep.", field, " applies to mode: ONLINE only"));
    }
  }

  // The sweep's values.
  for (auto st : {CheckRange(at, "max_num_seqs", sw.max_num_seqs(), 1, 1024),
                  CheckStrings(at, "spec_method", sw.spec_method(), {"none", "draft", "ngram", "suffix"}),
                  CheckRange(at, "num_spec_tokens", sw.num_spec_tokens(), 0, 64),
                  CheckRange(at, "temperature", sw.temperature(), 0, 100),
                  CheckRange(at, "max_num_batched_tokens", sw.max_num_batched_tokens(), 1, 1 << 20),
                  CheckStrings(at, "kv_cache_dtype", sw.kv_cache_dtype(), {"f32", "bf16"}),
                  CheckStrings(at, "quantization", sw.quantization(), {"none", "int8"}),
                  CheckRange(at, "request_rate", sw.request_rate(), 1e-6, INFINITY),
                  CheckRange(at, "burstiness", sw.burstiness(), 1e-3, 1e3),
                  CheckRange(at, "burst_factor", sw.burst_factor(), 1e-3, 1e3)}) {
    if (!st.ok()) return st;
  }
  for (int i = 0; i < sw.spec_method_size(); ++i) {
    if (sw.spec_method(i) == "draft" && s.draft().path().empty()) {
      return bad({"sweep", "spec_method"}, absl::StrCat("sweep.spec_method[", i, "]: \"draft\" needs draft { path: ... }"), i);
    }
  }
  for (int i = 0; i < sw.num_spec_tokens_size(); ++i) {
    if (s.max_spec_tokens() > 0 && sw.num_spec_tokens(i) > s.max_spec_tokens()) {
      return bad({"sweep", "num_spec_tokens"}, absl::StrCat("sweep.num_spec_tokens[", i, "]: ", sw.num_spec_tokens(i),
                                                            " is above max_spec_tokens (", s.max_spec_tokens(), ")"), i);
    }
  }
  return absl::OkStatus();
}

// The burst window and sweep.burst_factor (whose values ValidateSweep bounded), and record_trace:
// the fields of ONLINE runs that a serving simulator learns from.
absl::Status ValidateBursts(const Locator& at, const Experiment& s) {
  const bool online = s.mode() == v1::ONLINE;
  const v1::Sweep& sw = s.sweep();
  for (auto [field, v] : {std::pair{"burst_start_s", s.burst_start_s()}, {"burst_duration_s", s.burst_duration_s()}}) {
    if (!(v >= 0 && std::isfinite(v))) return Bad(at, {field}, absl::StrCat(field, ": ", Num(v), " is not a time >= 0"));
  }
  bool bursts = false;
  for (int i = 0; i < sw.burst_factor_size(); ++i) {
    const double f = sw.burst_factor(i);
    if (f == 1) continue;
    bursts = true;
    const std::string what = absl::StrCat("sweep.burst_factor[", i, "]: ", Num(f));
    if (!online) return Bad(at, {"sweep", "burst_factor"}, absl::StrCat(what, " needs mode: ONLINE"), i);
    if (s.burst_duration_s() <= 0) {
      return Bad(at, {"sweep", "burst_factor"}, absl::StrCat(what, " needs a burst window: burst_duration_s > 0"), i);
    }
    // Every request arrives at t = 0 at an infinite rate: no window could hold a burst.
    for (int j = 0; j < sw.request_rate_size(); ++j) {
      if (std::isinf(sw.request_rate(j))) {
        return Bad(at, {"sweep", "request_rate"},
                   absl::StrCat("sweep.request_rate[", j, "]: inf: ", what, " needs finite rates"), j);
      }
    }
  }
  if (!bursts && (s.burst_start_s() > 0 || s.burst_duration_s() > 0)) {
    const char* field = s.burst_duration_s() > 0 ? "burst_duration_s" : "burst_start_s";
    return Bad(at, {field}, absl::StrCat(field, ": the burst window needs sweep.burst_factor with a value other than 1"));
  }
  if (s.record_trace() && !online) return Bad(at, {"record_trace"}, "record_trace needs mode: ONLINE");
  return absl::OkStatus();
}

// Admission control: the in-process server's, so ONLINE without an endpoint (a remote server has its own).
absl::Status ValidateAdmission(const Locator& at, const Experiment& s) {
  if (!s.has_admission()) return absl::OkStatus();
  const v1::Admission& a = s.admission();
  if (s.mode() != v1::ONLINE || !s.endpoint().empty()) {
    return Bad(at, {"admission"}, "admission needs mode: ONLINE in process (an endpoint's server has its own)");
  }
  if (a.max_queue_len() < 0) return Bad(at, {"admission", "max_queue_len"}, "admission.max_queue_len: must be >= 0");
  for (auto [field, v] : {std::pair{"max_queue_delay_ms", a.max_queue_delay_ms()}, {"ttft_slo_ms", a.ttft_slo_ms()}}) {
    if (!(v >= 0 && std::isfinite(v))) {
      return Bad(at, {"admission", field}, absl::StrCat("admission.", field, ": ", Num(v), " must be >= 0"));
    }
  }
  return absl::OkStatus();
}

// Each endpoint of the spec's comma-separated list: a list needs a conversation to spread over it.
absl::Status ValidateEndpoints(const Locator& at, const Experiment& s) {
  if (s.endpoint().empty()) return absl::OkStatus();
  const std::vector<std::string> endpoints = absl::StrSplit(s.endpoint(), ',');
  if (endpoints.size() > 1 && !s.workload().has_conversation()) {
    return Bad(at, {"endpoint"}, "endpoint: a list of endpoints needs workload.conversation (its turns go to them)");
  }
  for (const std::string& e : endpoints) {
    if (e.rfind("grpc://", 0) != 0 && e.rfind("http://", 0) != 0) {
      return Bad(at, {"endpoint"}, absl::StrCat("endpoint: \"", e, "\" is not grpc://HOST:PORT or http://HOST:PORT"));
    }
  }
  return absl::OkStatus();
}

// A conversation workload: ONLINE, closed loop (no arrival sweep), its bounds, and its user
// messages file, read into *messages.
absl::Status ValidateConversation(const Locator& at, const Experiment& s, const std::string& spec_path,
                                  std::vector<std::string>* messages) {
  const v1::Workload& w = s.workload();
  if (!w.has_conversation()) return absl::OkStatus();
  const v1::Conversation& c = w.conversation();
  auto bad = [&](std::initializer_list<const char*> fields, const std::string& msg) { return Bad(at, fields, msg); };
  if (s.mode() != v1::ONLINE) {
    return bad({"workload", "conversation"}, "workload.conversation needs mode: ONLINE (a turn sends the answer to the "
                                             "one before it, which an OFFLINE run, every request at t = 0, cannot)");
  }
  if (w.num_requests() != 0) {
    return bad({"workload", "num_requests"}, "workload.num_requests: a conversation sends sessions * turns requests; "
                                             "leave it out");
  }
  const v1::Sweep& sw = s.sweep();
  for (auto [field, n] : {std::pair{"request_rate", sw.request_rate_size()}, {"burstiness", sw.burstiness_size()},
                          {"burst_factor", sw.burst_factor_size()}}) {
    if (n > 0) {
      return bad({"sweep", field}, absl::StrCat("sweep.", field, ": a conversation is closed loop (a session's next turn "
                                                "follows its answer); its load is sessions and session_concurrency"));
    }
  }
  struct Bound {
    const char* field;
    double value, hi;
  };
  for (const Bound& b : {Bound{"sessions", static_cast<double>(c.sessions()), 1e6}, {"turns", static_cast<double>(c.turns()), 1e4},
                         {"session_concurrency", static_cast<double>(c.session_concurrency()), 1e6},
                         {"user_words", static_cast<double>(c.user_words()), 1e5}, {"think_time_s", c.think_time_s(), 3600}}) {
    if (!(b.value >= 0 && b.value <= b.hi)) {
      return bad({"workload", "conversation", b.field},
                 absl::StrCat("workload.conversation.", b.field, ": ", Num(b.value), " is not in [0, ", Num(b.hi), "]"));
    }
  }
  const ConversationOptions d;
  if (static_cast<int64_t>(c.sessions() ? c.sessions() : d.num_sessions) * (c.turns() ? c.turns() : d.turns) > 1000000) {
    return bad({"workload", "conversation"}, "workload.conversation: sessions * turns is over 1000000 requests");
  }
  if (!c.turn_routing().empty() && !ParseTurnRouting(c.turn_routing()).ok()) {
    return bad({"workload", "conversation", "turn_routing"},
               absl::StrCat("workload.conversation.turn_routing: \"", c.turn_routing(), "\" is not session or rotate"));
  }
  if (c.user_messages_file().empty()) return absl::OkStatus();
  if (c.user_words() > 0) {
    return bad({"workload", "conversation", "user_words"},
               "workload.conversation.user_words is for synthetic user messages, not with user_messages_file");
  }
  auto loaded = LoadUserMessages(Resolve(spec_path, c.user_messages_file()));
  if (!loaded.ok()) {
    return bad({"workload", "conversation", "user_messages_file"},
               absl::StrCat("workload.conversation.user_messages_file: ", loaded.status().message()));
  }
  *messages = std::move(loaded).value();
  return absl::OkStatus();
}

absl::Status Validate(const Locator& at, Experiment& s, const std::string& spec_path, LoadedSpec* out) {
  if (auto st = ValidateInputs(at, s, spec_path, &out->prompts); !st.ok()) return st;
  if (auto st = ValidateConversation(at, s, spec_path, &out->user_messages); !st.ok()) return st;
  if (auto st = ValidateEndpoints(at, s); !st.ok()) return st;
  if (auto st = ValidateSweep(at, s); !st.ok()) return st;
  if (auto st = ValidateAdmission(at, s); !st.ok()) return st;
  return ValidateBursts(at, s);
}

void FillDefaults(Experiment& s, const std::string& spec_path) {
  if (s.name().empty()) {
    std::string base = spec_path.substr(spec_path.find_last_of('/') + 1);
    s.set_name(base.substr(0, base.find('.')));
  }
  if (s.mode() == v1::MODE_UNSPECIFIED) s.set_mode(v1::OFFLINE);
  v1::Workload& w = *s.mutable_workload();
  if (w.has_conversation()) {
    v1::Conversation& c = *w.mutable_conversation();
    const ConversationOptions d;
    if (c.sessions() == 0) c.set_sessions(d.num_sessions);
    if (c.turns() == 0) c.set_turns(d.turns);
    if (c.user_messages_file().empty() && c.user_words() == 0) c.set_user_words(d.user_words);
    if (c.turn_routing().empty()) c.set_turn_routing(TurnRoutingName(d.routing));
    w.set_num_requests(c.sessions() * c.turns());
  }
  if (w.num_requests() == 0) w.set_num_requests(64);
  if (w.max_tokens() == 0) w.set_max_tokens(kWorkloadMaxTokensDefault);  // the table's experiment row
  if (s.repeats() == 0) s.set_repeats(1);
  if (s.max_spec_tokens() == 0) s.set_max_spec_tokens(8);
  if (!s.endpoint().empty()) return;  // the server's own settings
  v1::Sweep& sw = *s.mutable_sweep();
  const Point d;
  if (sw.max_num_seqs_size() == 0) sw.add_max_num_seqs(d.max_num_seqs);
  if (sw.spec_method_size() == 0) sw.add_spec_method(d.spec_method);
  if (sw.num_spec_tokens_size() == 0) sw.add_num_spec_tokens(kDefaultNumSpecTokens);
  if (sw.max_num_batched_tokens_size() == 0) sw.add_max_num_batched_tokens(d.max_num_batched_tokens);
  if (sw.kv_cache_dtype_size() == 0) sw.add_kv_cache_dtype(d.kv_cache_dtype);
  if (sw.quantization_size() == 0) sw.add_quantization(d.quantization);
}

}  // namespace

absl::StatusOr<LoadedSpec> ParseSpec(const std::string& path, const std::string& text) {
  LoadedSpec out;
  out.path = path;
  out.text = text;
  TextFormat::Parser parser;
  FirstError errors;
  TextFormat::ParseInfoTree tree;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &out.spec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", errors.message().empty() ? "1:1: not a valid spec" : errors.message()));
  }
  const Locator at(path, &tree, out.text);
  if (auto st = Validate(at, out.spec, path, &out); !st.ok()) return st;
  FillDefaults(out.spec, path);
  // The hash of the spec as written (paths unresolved), so that running it from another directory
  // is still the same spec.
  std::string canonical;
  TextFormat::PrintToString(out.spec, &canonical);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : canonical) h = (h ^ c) * 1099511628211ull;
  out.hash = absl::StrFormat("%016x", h);
  for (std::string* p : {out.spec.mutable_model()->mutable_path(), out.spec.mutable_model()->mutable_tokenizer(),
                         out.spec.mutable_draft()->mutable_path()}) {
    *p = Resolve(path, *p);
  }
  if (out.spec.workload().has_prompts_file()) {
    out.spec.mutable_workload()->set_prompts_file(Resolve(path, out.spec.workload().prompts_file()));
  }
  if (out.spec.workload().has_conversation()) {
    v1::Conversation& c = *out.spec.mutable_workload()->mutable_conversation();
    c.set_user_messages_file(Resolve(path, c.user_messages_file()));
  }
  return out;
}

absl::StatusOr<LoadedSpec> LoadSpec(const std::string& path) {
  auto text = ReadTextFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path, ": cannot read the spec (", text.status().message(), ")"));
  return ParseSpec(path, *text);
}

std::string Point::Key() const {
  std::vector<std::string> parts;
  if (!remote) {
    parts = {absl::StrCat("max_num_seqs=", max_num_seqs), absl::StrCat("spec_method=", spec_method),
             absl::StrCat("num_spec_tokens=", num_spec_tokens ? absl::StrCat(*num_spec_tokens) : "none")};
  }
  parts.push_back(absl::StrCat("temperature=", Num(temperature)));
  if (!remote) {
    parts.push_back(absl::StrCat("max_num_batched_tokens=", max_num_batched_tokens));
    parts.push_back(absl::StrCat("kv_cache_dtype=", kv_cache_dtype));
    parts.push_back(absl::StrCat("quantization=", quantization));
  }
  if (request_rate) parts.push_back(absl::StrCat("request_rate=", Num(*request_rate)));
  if (burstiness) parts.push_back(absl::StrCat("burstiness=", Num(*burstiness)));
  if (burst_factor && *burst_factor != 1) parts.push_back(absl::StrCat("burst_factor=", Num(*burst_factor)));
  return absl::StrJoin(parts, ",");
}

nlohmann::json Point::Json() const {
  nlohmann::json j;
  j["mode"] = online ? "ONLINE" : "OFFLINE";
  auto engine = [&](auto v) { return remote ? nlohmann::json() : nlohmann::json(v); };
  j["max_num_seqs"] = engine(max_num_seqs);
  j["spec_method"] = engine(spec_method);
  j["num_spec_tokens"] = num_spec_tokens && !remote ? nlohmann::json(*num_spec_tokens) : nlohmann::json();
  j["temperature"] = temperature;
  j["max_num_batched_tokens"] = engine(max_num_batched_tokens);
  j["kv_cache_dtype"] = engine(kv_cache_dtype);
  j["quantization"] = engine(quantization);
  j["request_rate"] = !request_rate ? nlohmann::json() : std::isinf(*request_rate) ? nlohmann::json("inf") : nlohmann::json(*request_rate);
  j["burstiness"] = burstiness ? nlohmann::json(*burstiness) : nlohmann::json();
  // With the spec's workload.seed and num_requests: ArrivalTimes replays the run's arrivals.
  j["burst_factor"] = burst_factor ? nlohmann::json(*burst_factor) : nlohmann::json();
  j["burst_start_s"] = online ? nlohmann::json(burst_start_s) : nlohmann::json();
  j["burst_duration_s"] = online ? nlohmann::json(burst_duration_s) : nlohmann::json();
  return j;
}

std::string Point::Label() const {
  if (remote) return "server";
  if (spec_method == "none" || !num_spec_tokens) return "none";
  return *num_spec_tokens == 0 ? absl::StrCat(spec_method, " auto") : absl::StrCat(spec_method, " k=", *num_spec_tokens);
}

std::vector<Point> ExpandSweep(const Experiment& spec) {
  const v1::Sweep& sw = spec.sweep();
  Point base;  // its defaults stand for the dimensions the spec leaves empty
  base.online = spec.mode() == v1::ONLINE;
  base.remote = !spec.endpoint().empty();
  if (base.online) {
    base.burst_start_s = spec.burst_start_s();
    base.burst_duration_s = spec.burst_duration_s();
  }
  std::vector<Point> points = {base};
  // Every point so far times each value of one dimension, in order: the first dimension crossed
  // varies slowest.
  auto cross = [&points](const auto& values, auto set) {
    if (values.empty()) return;
    std::vector<Point> next;
    for (const Point& p : points) {
      for (const auto& v : values) {
        next.push_back(p);
        set(next.back(), v);
      }
    }
    points = std::move(next);
  };
  cross(sw.spec_method(), [](Point& p, const std::string& v) { p.spec_method = v; });
  cross(sw.num_spec_tokens(), [](Point& p, int32_t v) { p.num_spec_tokens = v; });
  cross(sw.temperature(), [](Point& p, double v) { p.temperature = v; });
  cross(sw.max_num_seqs(), [](Point& p, int32_t v) { p.max_num_seqs = v; });
  cross(sw.max_num_batched_tokens(), [](Point& p, int32_t v) { p.max_num_batched_tokens = v; });
  cross(sw.kv_cache_dtype(), [](Point& p, const std::string& v) { p.kv_cache_dtype = v; });
  cross(sw.quantization(), [](Point& p, const std::string& v) { p.quantization = v; });
  if (base.online && !spec.workload().has_conversation()) {  // a conversation is closed loop: no arrivals
    cross(sw.request_rate(), [](Point& p, double v) { p.request_rate = v; });
    google::protobuf::RepeatedField<double> one;  // Poisson gaps; no burst
    one.Add(1.0);
    cross(sw.burstiness().empty() ? one : sw.burstiness(), [](Point& p, double v) { p.burstiness = v; });
    cross(sw.burst_factor().empty() ? one : sw.burst_factor(), [](Point& p, double v) { p.burst_factor = v; });
  }
  // "none" with any k, and engine settings against an endpoint, collapse to one point each.
  std::vector<Point> unique;
  std::set<std::string> seen;
  for (Point& p : points) {
    if (p.spec_method == "none") p.num_spec_tokens.reset();
    if (p.spec_method != "none" && !p.num_spec_tokens) p.num_spec_tokens = kDefaultNumSpecTokens;
    if (seen.insert(p.Key()).second) unique.push_back(std::move(p));
  }
  return unique;
}

nlohmann::json SpecJson(const Experiment& spec) {
  std::string text;
  google::protobuf::util::JsonPrintOptions opt;
  opt.preserve_proto_field_names = true;
  opt.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &text, opt);
  return nlohmann::json::parse(text, nullptr, false);
}

}  // namespace specula::experiments
