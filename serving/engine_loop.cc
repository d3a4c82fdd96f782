#include "serving/engine_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specula {
std::optional<RequestDelta> RequestStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !deltas_.empty() || done_; });
  if (deltas_.empty()) return std::nullopt;
  RequestDelta d = std::move(deltas_.front());
  deltas_.pop_front();
  return d;
}

void RequestStream::SetListener(std::function<void()> listener) {
  bool waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
    waiting = !deltas_.empty();
  }
  if (waiting && listener) listener();
}

void RequestStream::Push(RequestDelta d) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = done_ || d.finished;
    deltas_.push_back(std::move(d));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

EngineLoop::EngineLoop(Engine* engine, LoopHooks hooks) : engine_(engine), hooks_(std::move(hooks)) {
  engine_->HandOffThreads();  // the engine's forwards run on the loop's thread from now on
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;  // a reset asked during the last iteration may have missed it: its caller wakes
  reset_cv_.notify_all();
}

std::shared_ptr<RequestStream> EngineLoop::Submit(Request r) {
  auto stream = std::make_shared<RequestStream>(r.id);
  const double now = engine_->NowMs();  // the engine's clock is safe to read from any thread
  {
    // Notified under the lock, here and in Cancel and CancelAll: these run on gRPC's and HTTP's
    // threads, and a notify after the unlock could still be touching cv_ when the server, drained,
    // destroys the loop (TSan saw it once in the chaos drill's shutdown). The destructor's lock then
    // orders every such notify before the destruction.
    std::lock_guard<std::mutex> lock(mu_);
    adds_.push_back(Add{std::move(r), stream, now});
    cv_.notify_all();
  }
  return stream;
}

void EngineLoop::Cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

void EngineLoop::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_all_ = true;
  cv_.notify_all();
}

absl::StatusOr<int32_t> EngineLoop::ResetPrefixCache(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the engine loop has stopped");
  const int64_t ticket = ++resets_asked_;
  cv_.notify_all();
  if (!reset_cv_.wait_for(lock, timeout, [&] { return resets_done_ >= ticket || stopped_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("the engine's step did not end within ", timeout.count(), " ms; the reset runs after it"));
  }
  if (resets_done_ < ticket) return absl::UnavailableError("the engine loop stopped before the reset");
  return reset_blocks_;
}

void EngineLoop::ApplyResets() {
  int64_t asked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    asked = resets_asked_;
    if (asked == resets_done_) return;
  }
  const int32_t blocks = engine_->ResetPrefixCache();
  std::lock_guard<std::mutex> lock(mu_);
  resets_done_ = asked;
  reset_blocks_ = blocks;
  reset_cv_.notify_all();
}

EngineSnapshot EngineLoop::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void EngineLoop::Run() {
  for (;;) {
    decltype(adds_) adds;
    std::vector<RequestId> cancels;
    bool stop, cancel_all;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: sleep until there is work. Busy: take what arrived during the last step.
      cv_.wait(lock, [&] {
        return stop_ || cancel_all_ || !adds_.empty() || !cancels_.empty() || resets_asked_ > resets_done_ ||
               engine_->HasUnfinished();
      });
      adds.swap(adds_);
      cancels.swap(cancels_);
      stop = stop_;
      cancel_all = stop_ || cancel_all_;
      cancel_all_ = false;
    }
    ApplyResets();  // before the adds: a request added in this iteration matches only what the reset left
    for (Add& add : adds) {
      const RequestId id = add.request.id;
      if (absl::Status st = engine_->AddRequest(std::move(add.request)); !st.ok()) {
        RequestDelta refused;
        refused.finished = true;
        refused.error = st;
        refused.id = id;
        refused.final.id = id;
        if (hooks_.on_refused) hooks_.on_refused(id);
        add.stream->Push(std::move(refused));
        continue;
      }
      active_[id] = Active{std::move(add.stream), add.submit_ms, false};
    }
    if (cancel_all) {
      for (auto& [id, a] : active_) cancels.push_back(id);
    }
    for (RequestId id : cancels) {
      if (active_.count(id)) engine_->Abort(id);  // Abort returns its output from the next Step()
    }
    // Aborted requests come back from this step; on stop, nothing else is run (Step() returns
    // the aborted ones at once when no sequence is left).
    std::vector<RequestDelta> deltas = engine_->Step();
    double oldest_queued_ms = 0;
    for (const auto& [id, a] : active_) {
      if (!a.first_token) oldest_queued_ms = std::max(oldest_queued_ms, engine_->NowMs() - a.submit_ms);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      const BlockManager& blocks = engine_->scheduler().blocks();
      snapshot_.num_running = engine_->scheduler().num_running();
      snapshot_.num_waiting = engine_->scheduler().num_waiting();
      snapshot_.kv_blocks_total = blocks.num_blocks();
      snapshot_.kv_blocks_used = blocks.num_blocks() - blocks.num_available();
      snapshot_.kv_blocks_peak = std::max(snapshot_.kv_blocks_peak, snapshot_.kv_blocks_used);
      snapshot_.num_preemptions = engine_->scheduler().num_preemptions();
      snapshot_.prefix_cache_queries = blocks.query_tokens();
      snapshot_.prefix_cache_hits = blocks.hit_tokens();
      snapshot_.oldest_queued_ms = oldest_queued_ms;
      snapshot_.stats = engine_->stats();
      num_running_.store(snapshot_.num_running, std::memory_order_relaxed);
      oldest_queued_ms_.store(oldest_queued_ms, std::memory_order_relaxed);
    }
    PublishDeltas(std::move(deltas));
    if (stop && active_.empty()) return;
  }
}

void EngineLoop::PublishDeltas(std::vector<RequestDelta> deltas) {
  for (RequestDelta& d : deltas) {
    auto it = active_.find(d.id);
    if (it == active_.end()) continue;
    Active& a = it->second;
    if (!a.first_token && !d.tokens.empty()) {
      a.first_token = true;
      if (hooks_.on_first_token) hooks_.on_first_token(engine_->NowMs() - a.submit_ms);
    }
    if (!d.finished) {
      a.stream->Push(std::move(d));
      continue;
    }
    d.final.arrival_ms = a.submit_ms;  // the client's view: from Submit, not from the step that admitted it
    // The hook first: what it counts (metrics, requests in flight) is current by the time the
    // client sees its last delta and sends the next request.
    if (hooks_.on_finished) hooks_.on_finished(d.final);
    a.stream->Push(std::move(d));
    active_.erase(it);
  }
}

}  // namespace specula
