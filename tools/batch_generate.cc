#include "tools/batch_generate.h"

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "core/status_macros.h"
#include "engine/run.h"
#include "nlohmann/json.hpp"
#include "request/finish.h"
#include "serving/openai_constraints.h"
#include "serving/spec_metrics.h"

namespace specula {
namespace {

using json = nlohmann::json;

struct Line {
  int32_t number = 0;
  json id;
  Request request;
  std::string error;
};

}  // namespace

PromptLineContext PromptLineContextOf(const LoadedEngine& e, ChatRenderer chat) {
  PromptLineContext c;
  c.request = RequestContextOf(e);
  c.sampling = e.defaults().sampling;
  c.ignore_eos = e.ignore_eos();
  c.chat = std::move(chat);
  return c;
}

namespace {

// The line's own fields over the flags' (SpecDefaults): types here, ranges in NormalizeRequest.
std::string ReadLineFields(const json& j, RequestSpec* r) {
  if (j.contains("max_tokens")) {
    if (!j["max_tokens"].is_number_integer()) return "field 'max_tokens' must be an integer";
    const int64_t v = j["max_tokens"].is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(
                                                                  j["max_tokens"].get<uint64_t>(), INT64_MAX))
                                                            : j["max_tokens"].get<int64_t>();
    if (absl::Status st = CheckGivenMaxTokens(Surface::kPromptsFile, v); !st.ok()) return std::string(st.message());
    r->max_tokens = static_cast<int32_t>(v);
  }
  auto number = [&](const char* field, float* dst) -> std::string {
    if (!j.contains(field)) return "";
    if (!j[field].is_number()) return absl::StrCat("field '", field, "' must be a number");
    *dst = j[field].get<float>();
    return "";
  };
  for (auto [field, dst] : {std::pair{"temperature", &r->sampling.temperature}, {"top_p", &r->sampling.top_p},
                            {"min_p", &r->sampling.min_p}, {"repetition_penalty", &r->sampling.repetition_penalty}}) {
    if (std::string e = number(field, dst); !e.empty()) return e;
  }
  if (j.contains("top_k")) {
    if (!j["top_k"].is_number_integer()) return "field 'top_k' must be an integer";
    r->sampling.top_k = j["top_k"].get<int32_t>();
  }
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned()) return "field 'seed' must be a non-negative integer";
    r->seed = j["seed"].get<uint64_t>();
  }
  if (j.contains("stop")) {
    const json& s = j["stop"];
    if (!s.is_string() && !s.is_array()) return "field 'stop' must be a string or a list of strings";
    for (const auto& e : s.is_string() ? json::array({s}) : s) {
      if (!e.is_string()) return "field 'stop' must be a string or a list of strings";
      r->stop_strings.push_back(e.get<std::string>());
    }
  }
  return "";
}

}  // namespace

std::string ParsePromptLine(const std::string& text, int32_t line_number, const PromptLineContext& context, json* id,
                            Request* request) {
  *id = line_number;
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return "not a JSON object";
  *id = j.contains("id") ? j["id"] : json(line_number);
  if (!j.contains("prompt") || !j["prompt"].is_string()) return "field 'prompt' is missing or not a string";
  RequestSpec spec = SpecDefaults(Surface::kPromptsFile, context.sampling);
  spec.ignore_eos = context.ignore_eos;
  if (std::string e = ReadLineFields(j, &spec); !e.empty()) return e;
  // Structured output by the OpenAI surface's fields (response_format, json_schema, regex via
  // structured_outputs...), read in order so that a schema keeps its properties' order.
  if (absl::Status st = ParseConstraintFields(nlohmann::ordered_json::parse(text), &spec.constraint); !st.ok()) {
    return std::string(st.message());
  }
  std::string prompt = j["prompt"].get<std::string>();
  PromptInput input;
  if (context.chat) {
    absl::StatusOr<std::string> rendered = context.chat(prompt);
    if (!rendered.ok()) return std::string(rendered.status().message());
    prompt = *std::move(rendered);
    input.templated = true;
  }
  input.text = prompt;
  absl::StatusOr<std::vector<TokenId>> ids = NormalizeRequest(Surface::kPromptsFile, context.request, input, &spec);
  if (!ids.ok()) return std::string(ids.status().message());
  *request = MakeRequest(line_number, *std::move(ids), std::move(spec));
  return "";
}

namespace {

void Progress(int32_t done, int32_t total, int64_t tokens, double ms) {
  const int width = 30;
  const int filled = total > 0 ? width * done / total : width;
  std::fprintf(stderr, "\r[%.*s%*s] %d/%d requests, %lld tokens, %.1f tok/s", filled,
               "##############################", width - filled, "", done, total,
               static_cast<long long>(tokens), ms > 0 ? tokens * 1000.0 / ms : 0.0);
  std::fflush(stderr);
}

}  // namespace

void WriteJsonLine(std::FILE* out, const json& j) {
  const std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::fwrite(s.data(), 1, s.size(), out);
  std::fflush(out);
}

json OutputJson(const json& id, const RequestOutput& o, int32_t num_spec_tokens) {
  json j = {{"id", id},
            {"text", o.text},
            {"token_ids", o.tokens},
            {"finish_reason", FinishName(o.finish)},
            {"prompt_tokens", o.prompt_tokens},
            {"cached_prompt_tokens", o.cached_prompt_tokens},
            {"ttft_ms", o.ttft_ms()},
            {"tpot_ms", o.tpot_ms()},
            {"preemptions", o.num_preemptions}};
  if (ShowsSpecDecoding(o.spec, num_spec_tokens)) {  // the grammar's forced drafts speculate without a proposer
    j["spec"] = SpecStatsJson(o.spec);
    j["metrics"] = {{"speculative_decoding", SpecDecodingJson(o.spec, num_spec_tokens)}};
  }
  return j;
}

json SpecStatsJson(const SpecStats& s) {
  return {{"drafts", s.drafts},
          {"draft_tokens", s.draft_tokens},
          {"accepted_tokens", s.accepted_tokens},
          {"accepted_per_position", s.accepted_per_position},
          {"acceptance_rate", s.acceptance_rate()},
          {"mean_acceptance_length", s.mean_acceptance_length()},
          {"forced_draft_tokens", s.forced_tokens},
          {"forced_accepted_tokens", s.forced_accepted},
          {"grammar_cut_tokens", s.cut_tokens}};
}

std::string SpecStatsLine(const SpecStats& s) {
  std::string per_pos;
  for (size_t i = 0; i < s.accepted_per_position.size(); ++i) {
    absl::StrAppend(&per_pos, i ? " " : "", s.drafts ? static_cast<double>(s.accepted_per_position[i]) / s.drafts : 0.0);
  }
  return absl::StrCat("[specula] speculation: ", s.drafts, " drafts, ", s.draft_tokens, " draft tokens, ",
                      s.accepted_tokens, " accepted (rate ", s.acceptance_rate(), "), mean acceptance length ",
                      s.mean_acceptance_length(), ", acceptance per position [", per_pos, "]",
                      s.forced_tokens + s.cut_tokens == 0 ? "" :
                          absl::StrCat("; grammar: ", s.forced_tokens, " forced drafts, ", s.forced_accepted,
                                       " accepted, ", s.cut_tokens, " proposer drafts cut"),
                      "\n");
}

std::string SpecLengthLine(const EngineStats& s) {
  int64_t total = 0;
  for (int64_t n : s.spec_k_histogram) total += n;
  std::string hist;
  for (size_t k = 0; k < s.spec_k_histogram.size(); ++k) {
    if (s.spec_k_histogram[k] == 0) continue;
    absl::StrAppend(&hist, hist.empty() ? "" : ", ", "k=", k, " ",
                    absl::StrFormat("%.1f%%", 100.0 * s.spec_k_histogram[k] / std::max<int64_t>(total, 1)));
  }
  std::string line = absl::StrFormat("[specula] speculation length: %s; steps without speculation: %.1f%% (%d of %d)",
                                     hist.empty() ? "none" : hist,
                                     100.0 * s.spec_off_steps / std::max<int64_t>(s.decode_steps, 1), s.spec_off_steps,
                                     s.decode_steps);
  if (s.cost_measured_tokens > 0) {  // adaptive speculation
    absl::StrAppend(&line, absl::StrFormat("; cost model: forwards up to %d tokens measured in %.1f ms",
                                           s.cost_measured_tokens, 1e3 * s.cost_measure_seconds));
    if (s.drafts_cannot_pay) {
      absl::StrAppend(&line, "; the draft costs about as much as the target: no acceptance would make drafts pay, "
                             "so auto runs without them");
    }
  }
  return line + "\n";
}

absl::Status RunBatchGenerate(LoadedEngine& e, const BatchOptions& opt, std::FILE* out) {
  std::ifstream in(opt.prompts_file);
  if (!in) return absl::NotFoundError(absl::StrCat(opt.prompts_file, ": cannot open"));
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e));
  Engine& engine = *made;
  const PromptLineContext context = PromptLineContextOf(e, opt.chat);
  std::map<RequestId, Line> lines;
  std::string text;
  int32_t number = 0, accepted = 0, rejected = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    Line line;
    line.number = number;
    std::string error = ParsePromptLine(text, number, context, &line.id, &line.request);
    if (error.empty()) {
      if (auto st = engine.AddRequest(line.request); !st.ok()) error = std::string(st.message());
    }
    if (!error.empty()) {
      std::fprintf(stderr, "%s:%d: %s\n", opt.prompts_file.c_str(), number, error.c_str());
      WriteJsonLine(out, {{"id", line.id}, {"line", number}, {"error", error}, {"finish_reason", "error"}});
      ++rejected;
      continue;
    }
    ++accepted;
    lines.emplace(number, std::move(line));
  }
  int32_t finished = 0;
  double last_progress = -1e9;
  RunCallbacks callbacks;
  callbacks.on_delta = [&](const RequestDelta& d) {
    if (!d.finished) return;
    ++finished;
    WriteJsonLine(out, OutputJson(lines.at(d.id).id, d.final, e.num_spec()));
  };
  callbacks.after_step = [&] {
    if (!opt.progress || engine.NowMs() - last_progress <= 200) return;
    last_progress = engine.NowMs();
    Progress(finished, accepted, engine.stats().generated_tokens, engine.NowMs());
  };
  if (auto run = RunToCompletion(engine, callbacks); !run.ok()) return run.status();
  const BlockManager& bm = engine.scheduler().blocks();
  if (opt.progress) Progress(finished, accepted, engine.stats().generated_tokens, engine.NowMs());
  std::fprintf(stderr,
               "\n[specula] %d requests (%d rejected), %lld generated tokens in %.2f s: %.1f tok/s; "
               "%lld steps, %lld prefill tokens computed, %lld preemptions, prefix-cache hit rate %.1f%%\n",
               accepted, rejected,
               static_cast<long long>(engine.stats().generated_tokens), engine.NowMs() / 1000,
               engine.stats().generated_tokens * 1000.0 / engine.NowMs(),
               static_cast<long long>(engine.stats().steps), static_cast<long long>(engine.stats().prefill_tokens),
               static_cast<long long>(engine.scheduler().num_preemptions()),
               bm.query_tokens() > 0 ? 100.0 * bm.hit_tokens() / bm.query_tokens() : 0.0);
  if (e.proposer != nullptr || engine.stats().spec.drafts > 0) {
    std::fputs(SpecStatsLine(engine.stats().spec).c_str(), stderr);
    if (e.proposer != nullptr) std::fputs(SpecLengthLine(engine.stats()).c_str(), stderr);
  }
  return absl::OkStatus();
}

}  // namespace specula
