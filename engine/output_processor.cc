#include "engine/output_processor.h"

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"

namespace specula {

void OutputProcessor::Add(const Request& r, double now_ms) {
  State s;
  s.out.id = r.id;
  s.out.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  s.out.arrival_ms = now_ms;
  s.stop_strings = r.stop_strings;
  for (const std::string& stop : r.stop_strings) s.hold_back = std::max(s.hold_back, std::max<size_t>(stop.size(), 1) - 1);
  s.last = r.prompt.empty() ? -1 : r.prompt.back();
  outputs_[r.id] = std::move(s);
}

void OutputProcessor::MarkChanged(RequestId id, State& s) {
  if (s.changed) return;
  s.changed = true;
  changed_.push_back(id);
}

void OutputProcessor::Scheduled(RequestId id, double now_ms) {
  RequestOutput& out = outputs_.at(id).out;
  if (out.scheduled_ms == 0) out.scheduled_ms = now_ms;
}

bool OutputProcessor::Append(RequestId id, absl::Span<const TokenId> tokens, double now_ms, int32_t cached_prompt_tokens,
                             absl::Span<const TokenLogprobs> logprobs) {
  if (tokens.empty()) return false;
  State& s = outputs_.at(id);
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
  MarkChanged(id, s);
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

void OutputProcessor::Finish(RequestId id, FinishReason reason, double now_ms, int32_t num_preemptions,
                             std::string error) {
  State& s = outputs_.at(id);
  if (s.finished) return;
  s.finished = true;
  s.out.finish = reason;
  s.out.finish_ms = now_ms;
  s.out.num_preemptions = num_preemptions;
  s.out.error = std::move(error);
  MarkChanged(id, s);
}

RequestDelta OutputProcessor::DeltaOf(State& s) {
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

std::vector<RequestDelta> OutputProcessor::TakeDeltas() {
  std::vector<RequestDelta> deltas;
  deltas.reserve(changed_.size());
  for (RequestId id : changed_) {
    auto it = outputs_.find(id);
    State& s = it->second;
    s.changed = false;
    deltas.push_back(DeltaOf(s));
    if (s.finished) {
      // The final text as the deltas spell it: valid UTF-8, whatever the surface.
      std::string text;
      TakeUtf8(s.out.text, true, &text);
      s.out.text = std::move(text);
      deltas.back().final = std::move(s.out);
      outputs_.erase(it);
    }
  }
  changed_.clear();
  return deltas;
}

}  // namespace specula
