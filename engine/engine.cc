#include "engine/engine.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace specula {

Engine::Engine(LlamaModel* model, const Tokenizer* tokenizer, const SchedulerConfig& config)
    : model_(model), tokenizer_(tokenizer), scheduler_(config),
      kv_(model->config(), {config.block_size, config.num_blocks}) {}

double Engine::NowMs() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
}

absl::Status Engine::AddRequest(Request r) {
  if (active_.count(r.id)) return absl::AlreadyExistsError(absl::StrCat("request id ", r.id, " is already in use"));
  if (auto st = ValidateSamplingParams(r.sampling); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", st.message()));
  }
  for (TokenId t : r.prompt) {
    if (t < 0 || t >= model_->config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": token id ", t, " outside the vocabulary"));
    }
  }
  if (!r.stop_strings.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": stop strings need a tokenizer"));
  }
  NewSequence n{r.id, r.prompt, r.max_tokens, r.stop_ids, r.priority, NowMs()};
  if (!r.ignore_eos && tokenizer_ != nullptr) {
    n.stop_ids.insert(n.stop_ids.end(), tokenizer_->eos_ids().begin(), tokenizer_->eos_ids().end());
  }
  if (auto st = scheduler_.Add(std::move(n)); !st.ok()) return st;
  Active a;
  a.sampler = std::make_unique<Sampler>(r.sampling);
  a.out.id = r.id;
  a.out.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  a.out.arrival_ms = NowMs();
  a.request = std::move(r);
  active_.emplace(a.request.id, std::move(a));
  return absl::OkStatus();
}

void Engine::Abort(RequestId id) {
  if (!active_.count(id)) return;
  scheduler_.Finish(id, FinishReason::kAborted);
  aborted_.push_back(Complete(id, FinishReason::kAborted));
}

RequestOutput Engine::Complete(RequestId id, FinishReason reason) {
  auto it = active_.find(id);
  RequestOutput out = std::move(it->second.out);
  active_.erase(it);
  out.finish = reason;
  out.finish_ms = NowMs();
  if (const SequenceState* s = scheduler_.Get(id)) out.num_preemptions = s->num_preemptions;
  scheduler_.Forget(id);
  return out;
}

std::vector<RequestOutput> Engine::Step() {
  std::vector<RequestOutput> done = std::move(aborted_);
  aborted_.clear();
  const StepPlan plan = scheduler_.Schedule(NowMs());
  if (plan.seqs.empty()) {
    if (plan.wait_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(std::min(plan.wait_ms, 5.0)));
    return done;
  }
  ++stats_.steps;
  ForwardBatch batch;
  for (const ScheduledSeq& s : plan.seqs) {
    const SequenceState* st = scheduler_.Get(s.id);
    batch.seqs.push_back({absl::MakeConstSpan(st->tokens).subspan(s.start_pos, s.num_tokens), s.start_pos, st->blocks});
    if (s.samples && s.num_tokens == 1 && s.start_pos >= st->num_prompt) {
      stats_.decode_tokens += 1;
    } else {
      stats_.prefill_tokens += s.num_tokens;
    }
  }
  StepResult result;
  if (auto status = model_->Forward(batch, kv_, LogitsMode::kLastPerSequence, &logits_); !status.ok()) {
    // Only reachable through a bug or corrupt state: fail this step's requests, keep the rest.
    for (const ScheduledSeq& s : plan.seqs) {
      scheduler_.Finish(s.id, FinishReason::kError);
      RequestOutput out = Complete(s.id, FinishReason::kError);
      out.error = std::string(status.message());
      done.push_back(std::move(out));
    }
    return done;
  }
  const int32_t vocab = model_->config().vocab_size;
  const double now = NowMs();
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    Active& a = active_.at(s.id);
    const SequenceState* st = scheduler_.Get(s.id);
    const TokenId t = a.sampler->Sample(absl::MakeConstSpan(logits_).subspan(i * vocab, vocab), st->tokens);
    result.outputs.push_back({s.id, {t}});
    if (a.out.tokens.empty()) {
      a.out.first_token_ms = now;
      a.out.cached_prompt_tokens = st->num_cached_prompt;
    }
    a.out.tokens.push_back(t);
    a.out.token_ms.push_back(now);
    ++stats_.generated_tokens;
    if (tokenizer_ != nullptr) {
      const TokenId prev = a.out.tokens.size() > 1 ? a.out.tokens[a.out.tokens.size() - 2] : st->tokens.back();
      a.out.text += tokenizer_->DecodeToken(prev, t);
    }
  }
  for (RequestId id : scheduler_.Update(plan, result)) {
    done.push_back(Complete(id, scheduler_.Get(id)->finish));
  }
  // Stop strings end a request and are cut from its text.
  for (const SeqOutput& o : result.outputs) {
    auto it = active_.find(o.id);
    if (it == active_.end()) continue;
    for (const std::string& stop : it->second.request.stop_strings) {
      const size_t pos = it->second.out.text.find(stop);
      if (stop.empty() || pos == std::string::npos) continue;
      it->second.out.text.resize(pos);
      scheduler_.Finish(o.id, FinishReason::kStopString);
      done.push_back(Complete(o.id, FinishReason::kStopString));
      break;
    }
  }
  return done;
}

}  // namespace specula
