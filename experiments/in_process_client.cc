#include "experiments/in_process_client.h"

#include <chrono>
#include <optional>
#include <string>

#include "request/boundary.h"

namespace specula::experiments {

RequestResult InProcessClient::Send(const LoadRequest& request) {
  using Clock = std::chrono::steady_clock;
  const size_t index = &request - requests_->data();  // RunLoad passes the dataset's own elements
  RequestResult out;
  const auto sent = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - sent).count(); };
  ServeRequest r;  // the table's in-process row: the server's default max_tokens, capped to the room
  r.surface = Surface::kInProcess;
  r.prompt = request.messages.empty() ? request.prompt : ConversationPrompt(request.messages);
  r.prompt_token_ids = request.prompt_token_ids;
  r.sampling.temperature = static_cast<float>(temperature_);
  r.seed = seed_ + index;
  r.max_tokens = request.max_tokens;
  r.ignore_eos = request.ignore_eos;
  r.constraint = request.constraint;
  auto admitted = server_->Submit(r);
  if (!admitted.ok()) {
    out.outcome = absl::IsResourceExhausted(admitted.status()) ? Outcome::kRejected : Outcome::kFailed;
    out.error = std::string(admitted.status().message());
    out.e2e_s = seconds();
    return out;
  }
  out.prompt_tokens = admitted->prompt_tokens;
  std::vector<TokenId> tokens;
  double last = 0;
  for (;;) {
    std::optional<RequestDelta> d = admitted->stream->Next(std::chrono::milliseconds(60000));
    if (!d) {
      out.error = "no output for 60 s";
      out.e2e_s = seconds();
      return out;
    }
    if (!d->tokens.empty()) {
      const double now = seconds();
      if (tokens.empty()) {
        out.ttft_s = now;
      } else {
        out.itl_s.push_back(now - last);
      }
      last = now;
      tokens.insert(tokens.end(), d->tokens.begin(), d->tokens.end());
    }
    if (!request.messages.empty()) out.text += d->text;  // a conversation's next turn sends it
    if (d->finished) {
      out.e2e_s = seconds();
      out.cached_tokens = d->final.cached_prompt_tokens;
      if (!d->error.ok()) {
        out.error = std::string(d->error.message());
      } else if (!d->final.error.empty()) {
        out.error = d->final.error;
      } else {
        out.outcome = Outcome::kOk;
      }
      break;
    }
  }
  out.output_tokens = static_cast<int32_t>(tokens.size());
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[index] = std::move(tokens);
  return out;
}

std::vector<std::vector<TokenId>> InProcessClient::tokens() {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_;
}

}  // namespace specula::experiments
