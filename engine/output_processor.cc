#include "engine/output_processor.h"

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"

namespace specula {

OutputState StartOutput(const Request& r, double now_ms) {
  OutputState s;
  s.out.id = r.id;
  s.out.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  s.out.arrival_ms = now_ms;
  s.stop_strings = r.stop_strings;
  for (const std::string& stop : r.stop_strings) s.hold_back = std::max(s.hold_back, std::max<size_t>(stop.size(), 1) - 1);
  s.last = r.prompt.empty() ? -1 : r.prompt.back();
  return s;
}

bool OutputProcessor::Append(OutputState& s, absl::Span<const TokenId> tokens, double now_ms,
                             int32_t cached_prompt_tokens, absl::Span<const TokenLogprobs> logprobs) const {
  if (tokens.empty()) return false;
  RequestOutput& out = s.out;
  if (out.tokens.empty()) {
    out.first_token_ms = now_ms;
    out.cached_prompt_tokens = cached_prompt_tokens;
  }
  const size_t before = out.text.size();
  out.logprobs.insert(out.logprobs.end(), logprobs.begin(), logprobs.end());
  for (TokenId t : tokens) {
    out.tokens.push_back(t);
    out.token_ms.push_back(now_ms);
    if (tokenizer_ != nullptr) out.text += tokenizer_->DecodeToken(s.last, t);
    s.last = t;
  }
  // A stop string the new text completes starts at most its length - 1 bytes before it.
  for (const std::string& stop : s.stop_strings) {
    if (stop.empty()) continue;
    const size_t from = before - std::min(before, stop.size() - 1);
    if (const size_t pos = out.text.find(stop, from); pos != std::string::npos) {
      out.text.resize(pos);
      return true;
    }
  }
  return false;
}

std::vector<RequestDelta> OutputProcessor::Process(absl::Span<OutputUpdate> updates, double now_ms) const {
  std::vector<RequestDelta> deltas;
  deltas.reserve(updates.size());
  for (OutputUpdate& u : updates) {
    OutputState& s = *u.state;
    if (s.finished) continue;
    RequestOutput& out = s.out;
    for (TokenLogprobs& lp : u.prompt_logprobs) out.prompt_logprobs.push_back(std::move(lp));
    if (Append(s, u.tokens, now_ms, u.cached_prompt_tokens, u.logprobs)) u.finish = FinishReason::kStopString;
    if (u.finish != FinishReason::kNone) {
      s.finished = true;
      out.finish = u.finish;
      out.finish_ms = now_ms;
      out.num_preemptions = u.num_preemptions;
      out.error = std::move(u.error);
    } else if (u.tokens.empty()) {
      continue;  // nothing new to send
    }
    deltas.push_back(DeltaOf(s));
    if (s.finished) {
      // The final text as the deltas spell it: valid UTF-8, whatever the surface.
      std::string text;
      TakeUtf8(out.text, true, &text);
      out.text = std::move(text);
      deltas.back().final = std::move(out);
    }
  }
  return deltas;
}

RequestDelta OutputProcessor::DeltaOf(OutputState& s) {
  RequestDelta d;
  d.id = s.out.id;
  const std::vector<TokenId>& tokens = s.out.tokens;
  d.tokens.assign(tokens.begin() + std::min(s.tokens_sent, tokens.size()), tokens.end());
  const std::vector<TokenLogprobs>& lps = s.out.logprobs;
  if (s.tokens_sent < lps.size()) d.logprobs.assign(lps.begin() + s.tokens_sent, lps.end());
  s.tokens_sent = tokens.size();
  if (!s.prompt_logprobs_sent && (!d.tokens.empty() || s.finished)) {
    d.prompt_logprobs = s.out.prompt_logprobs;
    s.prompt_logprobs_sent = true;
  }
  // Until the end, the last hold_back bytes wait: they may start a stop string that a later token
  // completes, which is cut from the text.
  const std::string& text = s.out.text;
  const size_t sendable = s.finished ? text.size() : text.size() - std::min(text.size(), s.hold_back);
  if (sendable > s.text_sent) {
    s.text_sent += TakeUtf8(std::string_view(text).substr(s.text_sent, sendable - s.text_sent), s.finished, &d.text);
  }
  d.finished = s.finished;
  return d;
}

}  // namespace specula
