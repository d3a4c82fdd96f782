#include "serving/openai_api.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "chat/chat_json.h"
#include "request/boundary.h"
#include "serving/openai_constraints.h"

namespace specula {
namespace {

using json = nlohmann::ordered_json;  // a schema keeps its properties in the order given

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool Present(const json& j, const char* f) { return j.contains(f) && !j[f].is_null(); }

// Fields that would change the output and are not implemented yet: refused by name, never ignored.
// A value that changes nothing (an empty list, plain text, no tool) passes.
absl::Status RefuseUnimplemented(const json& j, bool chat) {
  if (!chat) {  // tools are the chat template's; completions take a prompt as it is
    for (const char* f : {"tools", "functions"}) {
      if (Present(j, f) && !j[f].empty()) return Bad(f, "only /v1/chat/completions takes tools");
    }
    for (const char* f : {"tool_choice", "function_call"}) {
      if (Present(j, f) && j[f] != "none" && j[f] != "auto") return Bad(f, "only /v1/chat/completions takes tools");
    }
  }
  if (Present(j, "suffix")) return Bad("suffix", "not supported: this model has no fill-in-the-middle template");
  if (chat && Present(j, "echo") && j["echo"] != false) return Bad("echo", "only /v1/completions echoes the prompt");
  if (chat && Present(j, "best_of") && j["best_of"] != 1) return Bad("best_of", "only /v1/completions has it");
  return absl::OkStatus();
}

absl::Status Number(const json& j, const char* f, float* dst) {
  if (!Present(j, f)) return absl::OkStatus();
  if (!j[f].is_number()) return Bad(f, absl::StrCat("must be a number, got ", j[f].dump()));
  *dst = j[f].get<float>();
  return absl::OkStatus();
}

absl::Status Integer(const json& j, const char* f, int32_t* dst) {
  if (!Present(j, f)) return absl::OkStatus();
  if (!j[f].is_number_integer()) return Bad(f, absl::StrCat("must be an integer, got ", j[f].dump()));
  const int64_t v = j[f].get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX) return Bad(f, absl::StrCat(v, " is out of range"));
  *dst = static_cast<int32_t>(v);
  return absl::OkStatus();
}

// logit_bias: {"token id": bias, ...} (OpenAI's keys are strings).
absl::Status ParseLogitBias(const json& j, SamplingParams* s) {
  if (!Present(j, "logit_bias")) return absl::OkStatus();
  if (!j["logit_bias"].is_object()) return Bad("logit_bias", "must be an object of token id -> bias");
  for (const auto& [key, value] : j["logit_bias"].items()) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(key, &id)) return Bad("logit_bias", absl::StrCat("key '", key, "' is not a token id"));
    if (!value.is_number()) return Bad(absl::StrCat("logit_bias[", key, "]"), "must be a number");
    s->logit_bias.emplace_back(id, value.get<float>());
  }
  return absl::OkStatus();
}

// vLLM's cache_salt: a non-empty string when given (the request boundary bounds its length). Samples
// of the request share it with the spec they copy.
absl::Status ParseCacheSalt(const json& j, RequestSpec* r) {
  if (!Present(j, "cache_salt")) return absl::OkStatus();
  const json& salt = j["cache_salt"];
  if (!salt.is_string()) return Bad("cache_salt", absl::StrCat("must be a non-empty string, got ", salt.type_name()));
  if (salt.get_ref<const std::string&>().empty()) return Bad("cache_salt", "must be a non-empty string, got \"\"");
  r->cache_salt = salt.get<std::string>();
  return absl::OkStatus();
}

// logprobs: completions' `logprobs: N`; chat's `logprobs: true` and `top_logprobs: N`. Refused here,
// before the request reaches the server, as OpenAI's API refuses them: a bound out of the table.
absl::Status ParseLogprobs(const json& j, bool chat, HttpRequestBody* b) {
  const int32_t most = RulesOf(chat ? Surface::kChat : Surface::kCompletions).max_logprobs;
  if (!chat) {
    RETURN_IF_ERROR(Integer(j, "logprobs", &b->logprobs));
    if (Present(j, "logprobs") && (b->logprobs < 0 || b->logprobs > most)) {
      return Bad("logprobs", absl::StrCat("must be in [0, ", most, "], got ", b->logprobs));
    }
    return Present(j, "top_logprobs") ? Bad("top_logprobs", "is chat's; completions take logprobs: N") : absl::OkStatus();
  }
  const bool on = Present(j, "logprobs") && j["logprobs"] == true;
  if (Present(j, "logprobs") && !j["logprobs"].is_boolean()) return Bad("logprobs", "must be true or false");
  int32_t top = 0;
  RETURN_IF_ERROR(Integer(j, "top_logprobs", &top));
  if (Present(j, "top_logprobs") && !on) return Bad("top_logprobs", "needs logprobs: true");
  if (top < 0 || top > most) return Bad("top_logprobs", absl::StrCat("must be in [0, ", most, "], got ", top));
  b->logprobs = on ? top : -1;
  return absl::OkStatus();
}

absl::Status ParseStop(const json& j, ServeRequest* r) {
  if (!Present(j, "stop")) return absl::OkStatus();
  const json& s = j["stop"];
  if (s.is_string()) {
    r->stop_strings.push_back(s.get<std::string>());
    return absl::OkStatus();
  }
  if (!s.is_array()) return Bad("stop", "must be a string or a list of strings");
  for (const json& e : s) {
    if (!e.is_string()) return Bad("stop", "must be a string or a list of strings");
    r->stop_strings.push_back(e.get<std::string>());
  }
  return absl::OkStatus();
}

// How many samples: n, and completions' best_of (>= n: the n best of best_of by total logprob), in
// the table's bound.
absl::Status ParseSamples(const json& j, HttpRequestBody* b) {
  ServeRequest& r = b->request;
  const int32_t most = RulesOf(r.surface).max_n;
  RETURN_IF_ERROR(Integer(j, "n", &b->n));
  int32_t best_of = b->n;
  RETURN_IF_ERROR(Integer(j, "best_of", &best_of));
  if (b->n < 1 || b->n > most) return Bad("n", absl::StrCat("must be in [1, ", most, "], got ", b->n));
  if (best_of < b->n || best_of > most) {
    return Bad("best_of", absl::StrCat("must be in [n, ", most, "] (n is ", b->n, "), got ", best_of));
  }
  if (best_of > b->n && b->stream) return Bad("best_of", "cannot be streamed: the best are known at the end");
  if (best_of > b->n) r.logprobs = std::max(r.logprobs, 0);  // ranked by total logprob
  r.n = best_of;
  return absl::OkStatus();
}

// The request fields both endpoints share (vLLM's extensions top_k, min_p, repetition_penalty,
// ignore_eos and priority included), from the table's defaults for the endpoint (OpenAI's
// temperature 1; max_tokens left 0, which the table resolves: 16 for completions, the server's
// --max-tokens for chat).
absl::Status ParseCommon(const json& j, HttpRequestBody* b) {
  ServeRequest* r = &b->request;
  r->surface = b->chat ? Surface::kChat : Surface::kCompletions;
  static_cast<RequestSpec&>(*r) = SpecDefaults(r->surface);
  SamplingParams& s = r->sampling;
  for (auto st : {Number(j, "temperature", &s.temperature), Number(j, "top_p", &s.top_p), Number(j, "min_p", &s.min_p),
                  Number(j, "repetition_penalty", &s.repetition_penalty),
                  Number(j, "presence_penalty", &s.presence_penalty),
                  Number(j, "frequency_penalty", &s.frequency_penalty), Integer(j, "top_k", &s.top_k),
                  Integer(j, "max_tokens", &r->max_tokens), Integer(j, "max_completion_tokens", &r->max_tokens),
                  Integer(j, "priority", &r->priority), ParseLogitBias(j, &s), ParseCacheSalt(j, r)}) {
    if (!st.ok()) return st;
  }
  if (s.top_k < 0) s.top_k = 0;  // vLLM: -1 is off
  if (Present(j, "max_tokens")) RETURN_IF_ERROR(CheckGivenMaxTokens(r->surface, r->max_tokens));  // 0 is not "absent" here
  if (Present(j, "seed")) {
    if (!j["seed"].is_number_integer()) return Bad("seed", absl::StrCat("must be an integer, got ", j["seed"].dump()));
    r->seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
  }
  RETURN_IF_ERROR(RefuseUnimplemented(j, b->chat));
  RETURN_IF_ERROR(ParseConstraintFields(j, &r->constraint));
  RETURN_IF_ERROR(ParseStop(j, r));
  if (j.contains("ignore_eos")) r->ignore_eos = j["ignore_eos"].is_boolean() && j["ignore_eos"].get<bool>();
  b->stream = j.contains("stream") && j["stream"].is_boolean() && j["stream"].get<bool>();
  b->usage_in_stream = j.contains("stream_options") && j["stream_options"].is_object() &&
                       j["stream_options"].value("include_usage", json()) == true;
  b->echo = !b->chat && Present(j, "echo") && j["echo"] == true;
  b->return_token_ids = Present(j, "return_token_ids") && j["return_token_ids"] == true;
  b->tokens_as_ids = Present(j, "return_tokens_as_token_ids") && j["return_tokens_as_token_ids"] == true;
  RETURN_IF_ERROR(ParseLogprobs(j, b->chat, b));
  r->logprobs = b->logprobs;
  if (b->echo && b->logprobs >= 0) r->prompt_logprobs = b->logprobs;
  return ParseSamples(j, b);
}

absl::Status ParsePrompt(const json& j, ServeRequest* r) {
  if (!j.contains("prompt")) return Bad("prompt", "missing");
  json p = j["prompt"];
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];  // a batch of one
  if (p.is_string()) {
    r->prompt = p.get<std::string>();
    if (r->prompt.empty()) return Bad("prompt", "empty");
    return absl::OkStatus();
  }
  if (p.is_array() && !p.empty()) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer()) return Bad(absl::StrCat("prompt[", i, "]"), "must be a token id");
      r->prompt_token_ids.push_back(p[i].get<int32_t>());
    }
    return absl::OkStatus();
  }
  return Bad("prompt", "must be a string, a list of token ids, or a list of one of either");
}

// The request's tools as serving/tool_calls.h reads them, and the constraint they bring.
absl::Status ParseTools(const json& j, HttpRequestBody* b) {
  auto text = [&j](const char* f) { return Present(j, f) ? j[f].dump() : std::string(); };
  std::optional<bool> parallel;
  if (Present(j, "parallel_tool_calls")) {
    if (!j["parallel_tool_calls"].is_boolean()) return Bad("parallel_tool_calls", "must be true or false");
    parallel = j["parallel_tool_calls"].get<bool>();
  }
  ASSIGN_OR_RETURN(b->tools, ParseToolRequest(text("tools"), text("tool_choice"), parallel, text("functions"),
                                              text("function_call")));
  ConstraintSpec tag = ToolConstraint(b->tools);
  if (!tag.active()) return absl::OkStatus();
  ConstraintSpec& c = b->request.constraint;
  if (c.active()) return Bad(tag.field, absl::StrCat("cannot be combined with ", c.field, ": set one structured-output field"));
  c = std::move(tag);
  return absl::OkStatus();
}

// OpenAI chat messages: content is a string or a list of {"type": "text", "text": ...} parts.
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const json& j) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    return Bad("messages", "must be a non-empty list of {\"role\", \"content\"}");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const json& m = j["messages"][i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return Bad(field + ".role", "must be a string");
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
    if (!kRoles.count(msg.role)) {
      return Bad(field + ".role", absl::StrCat("'", msg.role, "' is not one of system, developer, user, assistant, tool"));
    }
    const json c = m.value("content", json(nullptr));
    if (c.is_string()) {
      msg.content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string()) {
          return Bad(field + ".content", "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
        }
        msg.content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      return Bad(field + ".content", "must be a string or a list of text parts");
    }
    if (absl::Status st = ParseMessageToolFields(m, &msg); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".", st.message()));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

absl::StatusOr<HttpRequestBody> ParseHttpRequestBody(const std::string& body, bool chat, const std::string& model,
                                                     const ChatTemplate* chat_template,
                                                     const absl::StatusOr<ChatSource>& chat_source) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Bad("body", "not a JSON object");
  if (j.contains("model") && j["model"].is_string() && j["model"] != model) {
    return absl::NotFoundError(absl::StrCat("model: '", j["model"].get<std::string>(),
                                            "' is not served here; this server serves '", model, "'"));
  }
  HttpRequestBody b;
  b.chat = chat;
  ServeRequest& r = b.request;
  RETURN_IF_ERROR(ParseCommon(j, &b));
  if (chat) {
    if (chat_template == nullptr) {
      return Bad("messages", absl::StrCat("this model has no chat template usable here (",
                                          chat_source.status().message(), "); use /v1/completions"));
    }
    ASSIGN_OR_RETURN(const std::vector<ChatMessage> messages, ParseMessages(j));
    RETURN_IF_ERROR(ParseTools(j, &b));
    auto text = chat_template->Render(messages, b.tools.tools, /*add_generation_prompt=*/true, chat_source->bos_token,
                                      chat_source->eos_token);
    if (!text.ok()) return Bad("messages", std::string(text.status().message()));
    r.prompt = *std::move(text);
    r.templated = true;
    // The degrade path matches the question being asked: the last message, when it is the user's
    // (after a tool's result or an assistant's prefix there is none).
    if (messages.back().role == "user") r.faq_query = messages.back().content;
  } else {
    RETURN_IF_ERROR(ParsePrompt(j, &r));
    r.faq_query = r.prompt;
  }
  return b;
}

int HttpStatusOf(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kFailedPrecondition: return 409;  // the server's state refuses (a reload)
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

std::string ErrorJson(const absl::Status& st, int code) {
  const std::string msg(st.message());
  json param = nullptr;
  if (code == 400 || code == 413) param = msg.substr(0, msg.find_first_of(":[ "));
  const char* type = code == 400 || code == 413 ? "invalid_request_error"
                     : code == 401              ? "authentication_error"
                     : code == 403              ? "permission_error"
                     : code == 409              ? "conflict_error"
                     : code == 404              ? "not_found_error"
                     : code == 429              ? "rate_limit_error"
                     : code == 503              ? "service_unavailable_error"
                                                : "internal_error";
  return json{{"error", {{"message", msg}, {"type", type}, {"param", param}, {"code", code}}}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

}  // namespace specula
