#include "serving/engine_loop.h"

#include <utility>

namespace specula {

std::optional<TokenDelta> RequestStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !deltas_.empty() || done_; });
  if (deltas_.empty()) return std::nullopt;
  TokenDelta d = std::move(deltas_.front());
  deltas_.pop_front();
  return d;
}

void RequestStream::Push(TokenDelta d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = done_ || d.finished;
    deltas_.push_back(std::move(d));
  }
  cv_.notify_all();
}

EngineLoop::EngineLoop(Engine* engine) : engine_(engine), thread_([this] { Run(); }) {}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestStream> EngineLoop::Submit(Request r) {
  auto stream = std::make_shared<RequestStream>(r.id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    adds_.emplace_back(std::move(r), stream);
  }
  cv_.notify_all();
  return stream;
}

void EngineLoop::Cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

EngineSnapshot EngineLoop::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void EngineLoop::Run() {
  for (;;) {
    decltype(adds_) adds;
    std::vector<RequestId> cancels;
    bool stop;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: sleep until there is work. Busy: take what arrived during the last step.
      cv_.wait(lock, [&] { return stop_ || !adds_.empty() || !cancels_.empty() || engine_->HasUnfinished(); });
      adds.swap(adds_);
      cancels.swap(cancels_);
      stop = stop_;
    }
    for (auto& [request, stream] : adds) {
      const RequestId id = request.id;
      if (absl::Status st = engine_->AddRequest(std::move(request)); !st.ok()) {
        TokenDelta refused;
        refused.finished = true;
        refused.error = st;
        refused.final.id = id;
        stream->Push(std::move(refused));
        continue;
      }
      active_[id] = Active{std::move(stream)};
    }
    if (stop) {
      for (auto& [id, a] : active_) cancels.push_back(id);
    }
    for (RequestId id : cancels) {
      if (active_.count(id)) engine_->Abort(id);  // Abort returns its output from the next Step()
    }
    // Aborted requests come back from this step; on stop, nothing else is run (Step() returns
    // the aborted ones at once when no sequence is left).
    std::vector<RequestOutput> finished = engine_->Step();
    {
      std::lock_guard<std::mutex> lock(mu_);
      const BlockManager& blocks = engine_->scheduler().blocks();
      snapshot_.num_running = engine_->scheduler().num_running();
      snapshot_.num_waiting = engine_->scheduler().num_waiting();
      snapshot_.kv_blocks_total = blocks.num_blocks();
      snapshot_.kv_blocks_used = blocks.num_blocks() - blocks.num_available();
      snapshot_.stats = engine_->stats();
    }
    PublishDeltas(std::move(finished));
    if (stop && active_.empty()) return;
  }
}

void EngineLoop::PublishDeltas(std::vector<RequestOutput> finished) {
  auto delta_of = [](Active& a, const RequestOutput& out) {
    TokenDelta d;
    d.tokens.assign(out.tokens.begin() + std::min(a.tokens_sent, out.tokens.size()), out.tokens.end());
    // A stop string cuts the final text; what was sent before the cut stays sent.
    if (out.text.size() > a.text_sent) d.text = out.text.substr(a.text_sent);
    a.tokens_sent = std::max(a.tokens_sent, out.tokens.size());
    a.text_sent = std::max(a.text_sent, out.text.size());
    return d;
  };
  for (RequestOutput& out : finished) {
    auto it = active_.find(out.id);
    if (it == active_.end()) continue;
    TokenDelta d = delta_of(it->second, out);
    d.finished = true;
    d.final = std::move(out);
    it->second.stream->Push(std::move(d));
    active_.erase(it);
  }
  for (auto& [id, a] : active_) {
    const RequestOutput* out = engine_->Peek(id);
    if (out == nullptr || out->tokens.size() <= a.tokens_sent) continue;
    a.stream->Push(delta_of(a, *out));
  }
}

}  // namespace specula
