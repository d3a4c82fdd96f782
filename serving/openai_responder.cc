// OpenAiResponder: one call's deltas as OpenAI completions and chat completions (openai_api.h).
#include <algorithm>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "request/finish.h"
#include "serving/openai_api.h"
#include "serving/spec_metrics.h"

namespace specula {
namespace {

using json = nlohmann::json;
using Sample = OpenAiResponder::Sample;

// JSON has no -inf: vLLM's floor for a token of probability 0.
float Finite(float lp) { return std::isfinite(lp) ? lp : -9999.0f; }

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string Event(const json& j) { return "data: " + Dump(j) + "\n\n"; }

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

// The text of each scored token, decoded after the token before it (`prev`, -1: none).
struct Scored {
  TokenId prev;
  const TokenLogprobs* lp;  // null: the first prompt token, which nothing scores
  TokenId token;
};

// How a logprobs entry names a token: its text after `prev`, or "token_id:ID".
struct Namer {
  const Tokenizer& tok;
  bool as_ids;
  std::string operator()(TokenId prev, TokenId id) const {
    return as_ids ? absl::StrCat("token_id:", id) : tok.DecodeToken(prev, id);
  }
};

// Completions' logprobs object ({tokens, token_logprobs, top_logprobs, text_offset}) for `scored`,
// its offsets counted from *offset. The sampled token is always among top_logprobs (as vLLM).
json CompletionLogprobs(const Namer& name, const std::vector<Scored>& scored, size_t* offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const Scored& s : scored) {
    const std::string text = name(s.prev, s.token);
    tokens.push_back(text);
    offsets.push_back(*offset);
    *offset += text.size();
    if (s.lp == nullptr) {
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    token_lps.push_back(Finite(s.lp->logprob));
    json top = json::object();
    for (const auto& [id, lp] : s.lp->top) top[name(s.prev, id)] = Finite(lp);
    top[text] = Finite(s.lp->logprob);
    tops.push_back(std::move(top));
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// Chat's logprobs object ({"content": [{token, logprob, bytes, top_logprobs}]}).
json ChatLogprobs(const Namer& name, const std::vector<Scored>& scored) {
  json content = json::array();
  for (const Scored& s : scored) {
    const std::string text = name(s.prev, s.token);
    json top = json::array();
    for (const auto& [id, lp] : s.lp->top) {
      const std::string t = name(s.prev, id);
      top.push_back({{"token", t}, {"logprob", Finite(lp)}, {"bytes", Bytes(t)}});
    }
    content.push_back({{"token", text}, {"logprob", Finite(s.lp->logprob)}, {"bytes", Bytes(text)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// The generated tokens [from, to) of a sample, each after the one before it.
std::vector<Scored> Generated(const Sample& s, const std::vector<TokenId>& prompt, size_t from, size_t to) {
  std::vector<Scored> out;
  for (size_t k = from; k < to && k < s.logprobs.size(); ++k) {
    out.push_back({k > 0 ? s.tokens[k - 1] : prompt.back(), &s.logprobs[k], s.tokens[k]});
  }
  return out;
}

std::vector<Scored> PromptScored(const Sample& s, const std::vector<TokenId>& prompt) {
  std::vector<Scored> out;
  for (size_t p = 0; p < prompt.size(); ++p) {
    out.push_back({p > 0 ? prompt[p - 1] : -1, p > 0 && p - 1 < s.prompt_logprobs.size() ? &s.prompt_logprobs[p - 1] : nullptr,
                   prompt[p]});
  }
  return out;
}

// A `metrics` member: {"speculative_decoding": the statistics of `s`}, or null there (vLLM's value at a
// response's root for n > 1, where each choice carries its own).
json SpecMetrics(const SpecStats* s, int32_t num_spec_tokens) {
  return {{"speculative_decoding", s != nullptr ? SpecDecodingJson(*s, num_spec_tokens) : json(nullptr)}};
}

// The root's `metrics` over the response's choices: one choice's object, or null for n > 1, where each
// choice that shows its own carries it; none where no choice shows any (ShowsSpecDecoding).
std::optional<json> RootSpecMetrics(const std::vector<const Sample*>& choices, int32_t num_spec_tokens) {
  const bool any = std::any_of(choices.begin(), choices.end(),
                               [&](const Sample* c) { return ShowsSpecDecoding(c->final.spec, num_spec_tokens); });
  if (!any) return std::nullopt;
  return SpecMetrics(choices.size() == 1 ? &choices[0]->final.spec : nullptr, num_spec_tokens);
}

// The root's `metrics`: RootSpecMetrics' and, on a server with a shared KV store, the request's store
// timings as `kv_store`. Those are sample 0's, as the usage's cached tokens: it runs first and fetches
// what the other samples then find in the local prefix cache.
std::optional<json> RootMetrics(const std::vector<const Sample*>& choices, const Sample& first, int32_t num_spec_tokens,
                                bool kv_store) {
  std::optional<json> m = RootSpecMetrics(choices, num_spec_tokens);
  if (!kv_store) return m;
  if (!m.has_value()) m = json::object();
  (*m)["kv_store"] = {{"fetched_tokens", first.final.kv_store_tokens}, {"fetch_ms", first.final.kv_fetch_ms},
                      {"install_ms", first.final.kv_install_ms}};
  return m;
}

// OpenAI's usage object: the prompt's tokens served from a prefix cache (local or the shared store's)
// in prompt_tokens_details, sample 0's (the others reuse its blocks).
json Usage(int32_t prompt_tokens, int32_t completion_tokens, const Sample& first) {
  return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", first.final.cached_prompt_tokens}}}};
}

// A finish reason as OpenAI gives it: "tool_calls" (the older API: "function_call") when the output
// ended by its grammar after calling tools.
std::string FinishName(FinishReason f, int calls, bool legacy) {
  const std::string name = OpenAiFinishName(f);
  if (calls == 0 || name != "stop") return name;
  return legacy ? "function_call" : "tool_calls";
}

// The assistant message of a finished chat choice: its text, or with tools the calls read back from
// it (tool_calls; the older API's function_call: the first) and the text around them (null if none).
json AssistantMessage(const std::string& text, const ToolRequest& tools, const std::string& call_ids, int* calls) {
  json m = {{"role", "assistant"}, {"content", text}};
  *calls = 0;
  if (!tools.parses_calls()) return m;
  ParsedToolCalls parsed = ExtractToolCalls(text, call_ids);
  *calls = static_cast<int>(parsed.calls.size());
  if (parsed.calls.empty()) return m;
  m["content"] = parsed.content.empty() ? json(nullptr) : json(parsed.content);
  if (tools.legacy) {
    m["function_call"] = {{"name", parsed.calls[0].name}, {"arguments", parsed.calls[0].arguments}};
    return m;
  }
  json list = json::array();
  for (const ChatToolCall& c : parsed.calls) {
    list.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  m["tool_calls"] = std::move(list);
  return m;
}

// A streamed chunk's delta from the tool-call reader's events: content, and each call's start and
// argument pieces (tool_calls[{index, id, type, function: {name, arguments}}], a piece merged into
// the entry before it of the same call; the older API's function_call: the first call only).
void ToolDelta(const std::vector<ToolStreamEvent>& events, bool legacy, json* delta) {
  std::string content;
  json calls = json::array();
  for (const ToolStreamEvent& e : events) {
    if (e.kind == ToolStreamEvent::Kind::kContent) {
      content += e.text;
    } else if (legacy && e.index > 0) {
      continue;
    } else if (e.kind == ToolStreamEvent::Kind::kCallStart) {
      calls.push_back({{"index", e.index}, {"id", e.id}, {"type", "function"},
                       {"function", {{"name", e.name}, {"arguments", ""}}}});
    } else if (!calls.empty() && calls.back()["index"] == e.index) {
      calls.back()["function"]["arguments"] = calls.back()["function"]["arguments"].get<std::string>() + e.text;
    } else {
      calls.push_back({{"index", e.index}, {"function", {{"arguments", e.text}}}});
    }
  }
  if (!content.empty() || calls.empty()) (*delta)["content"] = content;
  if (calls.empty()) return;
  if (!legacy) {
    (*delta)["tool_calls"] = std::move(calls);
    return;
  }
  json fn = calls[0]["function"];
  for (size_t k = 1; k < calls.size(); ++k) fn["arguments"] = fn["arguments"].get<std::string>() + calls[k]["function"]["arguments"].get<std::string>();
  (*delta)["function_call"] = std::move(fn);
}

double TotalLogprob(const Sample& s) {
  double t = 0;
  for (const TokenLogprobs& lp : s.logprobs) t += lp.logprob;
  return t;
}

// A body's or chunk's first fields: OpenAI's system_fingerprint is the model's version (as OpenAI's
// names its backend's configuration). An answer that the model did not make says which path did.
json Head(const std::string& id, const char* object, std::time_t created, const std::string& model,
          const std::string& version, const std::string& answered_by) {
  json head = {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
  if (!version.empty()) head["system_fingerprint"] = version;
  if (answered_by != "model") head["answered_by"] = answered_by;
  return head;
}

}  // namespace

OpenAiResponder::OpenAiResponder(const HttpRequestBody& call, std::string model, std::string id,
                                 const Generation& generation, const Tokenizer* tokenizer, std::time_t created)
    : call_(call), model_(std::move(model)), id_(std::move(id)), created_(created), tokenizer_(tokenizer),
      prompt_(generation.prompt()), samples_(generation.n()), prompt_tokens_(static_cast<int32_t>(prompt_.size())),
      spec_tokens_(generation.spec_metrics_tokens()), kv_store_(generation.kv_store_metrics()),
      answered_by_(generation.answered_by()), version_(generation.model_version()) {}

std::string OpenAiResponder::EchoText() const {
  if (!call_.echo) return "";
  return call_.request.prompt.empty() ? tokenizer_->Decode(prompt_) : call_.request.prompt;
}

absl::StatusOr<std::string> OpenAiResponder::Add(int32_t index, const RequestDelta& d) {
  Sample& s = samples_.at(index);
  s.text += d.text;
  s.tokens.insert(s.tokens.end(), d.tokens.begin(), d.tokens.end());
  s.logprobs.insert(s.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  if (!d.prompt_logprobs.empty()) s.prompt_logprobs = d.prompt_logprobs;
  if (d.finished && !s.finished) {
    s.finished = true;
    s.final = d.final;
    ++finished_;
  }
  if (!d.error.ok() && !call_.stream) return d.error;
  if (call_.stream) return StreamEvents(index, d, !d.error.ok());
  return done() ? Body() : std::string();
}

std::string OpenAiResponder::StreamEvents(int32_t index, const RequestDelta& d, bool refused) {
  Sample& s = samples_[index];
  const char* object = call_.chat ? "chat.completion.chunk" : "text_completion";
  std::string out;
  if (refused) {
    out = "data: " + ErrorJson(d.error, HttpStatusOf(d.error)) + "\n\n";
  } else {
    json c = {{"index", index}, {"logprobs", nullptr},
              {"finish_reason", d.finished ? json(OpenAiFinishName(d.final.finish)) : json(nullptr)}};
    const size_t to = s.tokens.size(), from = to - d.tokens.size();
    if (call_.chat && call_.tools.parses_calls()) {
      if (!s.tool_calls.has_value()) s.tool_calls.emplace(absl::StrCat(id_, "-", index));
      std::vector<ToolStreamEvent> events = s.tool_calls->Feed(d.text);
      if (d.finished) {
        for (ToolStreamEvent& e : s.tool_calls->Finish()) events.push_back(std::move(e));
        c["finish_reason"] = FinishName(d.final.finish, s.tool_calls->calls(), call_.tools.legacy);
      }
      c["delta"] = s.first_sent ? json::object() : json{{"role", "assistant"}};
      ToolDelta(events, call_.tools.legacy, &c["delta"]);
    } else if (call_.chat) {
      c["delta"] = s.first_sent ? json{{"content", d.text}} : json{{"role", "assistant"}, {"content", d.text}};
      if (call_.logprobs >= 0) c["logprobs"] = ChatLogprobs(Namer{*tokenizer_, call_.tokens_as_ids}, Generated(s, prompt_, from, to));
    } else {
      std::vector<Scored> scored = s.first_sent || !call_.echo ? std::vector<Scored>{} : PromptScored(s, prompt_);
      c["text"] = (s.first_sent ? "" : EchoText()) + d.text;
      const std::vector<Scored> gen = Generated(s, prompt_, from, to);
      scored.insert(scored.end(), gen.begin(), gen.end());
      if (call_.logprobs >= 0) c["logprobs"] = CompletionLogprobs(Namer{*tokenizer_, call_.tokens_as_ids}, scored, &s.offset);
    }
    // With n > 1 a choice's statistics ride its last chunk; one choice's ride the usage chunk (vLLM).
    if (d.finished && samples_.size() > 1 && ShowsSpecDecoding(d.final.spec, spec_tokens_)) {
      c["metrics"] = SpecMetrics(&d.final.spec, spec_tokens_);
    }
    json chunk = Head(id_, object, created_, model_, version_, answered_by_);
    if (call_.return_token_ids) {
      c["token_ids"] = d.tokens;
      if (!s.first_sent) chunk["prompt_token_ids"] = prompt_;
    }
    chunk["choices"] = json::array({c});  // not `= {c}`: clang copies a one-element list (CWG 1467)
    s.first_sent = true;
    out = Event(chunk);
  }
  if (!done()) return out;
  if (call_.usage_in_stream) {
    int32_t completion = 0;
    for (const Sample& x : samples_) completion += static_cast<int32_t>(x.tokens.size());
    json chunk = Head(id_, object, created_, model_, version_, answered_by_);
    chunk["choices"] = json::array();
    chunk["usage"] = Usage(prompt_tokens_, completion, samples_[0]);
    std::vector<const Sample*> all;  // [n]
    for (const Sample& x : samples_) all.push_back(&x);
    if (auto m = RootMetrics(all, samples_[0], spec_tokens_, kv_store_)) chunk["metrics"] = *std::move(m);
    out += Event(chunk);
  }
  return out + "data: [DONE]\n\n";
}

std::string OpenAiResponder::Body() const {
  // The choices: every sample in order, or best_of's n with the highest total logprob.
  std::vector<size_t> order(samples_.size());
  std::iota(order.begin(), order.end(), 0);
  if (static_cast<size_t>(call_.n) < samples_.size()) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return TotalLogprob(samples_[a]) > TotalLogprob(samples_[b]); });
    order.resize(call_.n);
  }
  json choices = json::array();
  int32_t completion = 0;
  for (const Sample& x : samples_) completion += static_cast<int32_t>(x.tokens.size());
  for (size_t c = 0; c < order.size(); ++c) {
    const Sample& s = samples_[order[c]];
    json choice = {{"index", c}, {"logprobs", nullptr}, {"finish_reason", OpenAiFinishName(s.final.finish)}};
    const bool show = call_.logprobs >= 0;  // best_of's own logprobs stay inside
    if (call_.chat) {
      int calls = 0;
      choice["message"] = AssistantMessage(s.text, call_.tools, absl::StrCat(id_, "-", order[c]), &calls);
      choice["finish_reason"] = FinishName(s.final.finish, calls, call_.tools.legacy);
      if (show) choice["logprobs"] = ChatLogprobs(Namer{*tokenizer_, call_.tokens_as_ids}, Generated(s, prompt_, 0, s.tokens.size()));
    } else {
      choice["text"] = EchoText() + s.text;
      if (show) {
        std::vector<Scored> scored = call_.echo ? PromptScored(s, prompt_) : std::vector<Scored>{};
        const std::vector<Scored> gen = Generated(s, prompt_, 0, s.tokens.size());
        scored.insert(scored.end(), gen.begin(), gen.end());
        size_t offset = 0;
        choice["logprobs"] = CompletionLogprobs(Namer{*tokenizer_, call_.tokens_as_ids}, scored, &offset);
      }
    }
    if (call_.return_token_ids) choice["token_ids"] = s.tokens;
    if (order.size() > 1 && ShowsSpecDecoding(s.final.spec, spec_tokens_)) {
      choice["metrics"] = SpecMetrics(&s.final.spec, spec_tokens_);
    }
    choices.push_back(std::move(choice));
  }
  json body = Head(id_, call_.chat ? "chat.completion" : "text_completion", created_, model_, version_, answered_by_);
  body["choices"] = std::move(choices);
  body["usage"] = Usage(prompt_tokens_, completion, samples_[0]);
  if (call_.return_token_ids) body["prompt_token_ids"] = prompt_;
  std::vector<const Sample*> chosen;  // [n]
  for (size_t i : order) chosen.push_back(&samples_[i]);
  if (auto m = RootMetrics(chosen, samples_[0], spec_tokens_, kv_store_)) body["metrics"] = *std::move(m);
  return Dump(body);
}

}  // namespace specula
