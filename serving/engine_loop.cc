#include "serving/engine_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

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

// Not owned: an aliasing pointer with no owner.
EngineLoop::EngineLoop(Engine* engine, LoopHooks hooks)
    : EngineLoop(std::shared_ptr<Engine>(std::shared_ptr<Engine>(), engine), std::move(hooks)) {}

EngineLoop::EngineLoop(std::shared_ptr<Engine> engine, LoopHooks hooks) : hooks_(std::move(hooks)) {
  engine->HandOffThreads();  // the engine's forwards run on the loop's thread from now on
  submit_lane_ = engine;
  lanes_.push_back(std::move(engine));
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
  std::shared_ptr<Engine> lane;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lane = submit_lane_;
  }
  return Submit(std::move(r), std::move(lane));
}

std::shared_ptr<RequestStream> EngineLoop::Submit(Request r, std::shared_ptr<Engine> lane) {
  auto stream = std::make_shared<RequestStream>(r.id);
  const double now = lane->NowMs();  // the engine's clock is safe to read from any thread
  {
    // Notified under the lock, here and in Cancel and CancelAll: these run on gRPC's and HTTP's
    // threads, and a notify after the unlock could still be touching cv_ when the server, drained,
    // destroys the loop (TSan saw it once in the chaos drill's shutdown). The destructor's lock then
    // orders every such notify before the destruction.
    std::lock_guard<std::mutex> lock(mu_);
    adds_.push_back(Add{std::move(r), stream, now, std::move(lane)});
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

absl::Status EngineLoop::AwaitLoop(std::unique_lock<std::mutex>& lock, const int64_t& done, int64_t ticket,
                                   std::chrono::milliseconds timeout, const char* what) {
  cv_.notify_all();
  if (!reset_cv_.wait_for(lock, timeout, [&] { return done >= ticket || stopped_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("the engine's step did not end within ", timeout.count(), " ms; the ", what, " runs after it"));
  }
  if (done < ticket) return absl::UnavailableError(absl::StrCat("the engine loop stopped before the ", what));
  return absl::OkStatus();
}

absl::StatusOr<int32_t> EngineLoop::ResetPrefixCache(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the engine loop has stopped");
  RETURN_IF_ERROR(AwaitLoop(lock, resets_done_, ++resets_asked_, timeout, "reset"));
  return reset_blocks_;
}

absl::Status EngineLoop::Switch(std::shared_ptr<Engine> next, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the engine loop has stopped");
  submit_lane_ = next;
  switch_to_ = std::move(next);
  return AwaitLoop(lock, switches_done_, ++switches_asked_, timeout, "switch");
}

void EngineLoop::AddLane(const std::shared_ptr<Engine>& lane) {
  for (const auto& l : lanes_) {
    if (l.get() == lane.get()) return;
  }
  lanes_.push_back(lane);
}

bool EngineLoop::AnyUnfinished() const {
  for (const auto& l : lanes_) {
    if (l->HasUnfinished()) return true;
  }
  return false;
}

// A lane other than the current one goes once its engine holds no request: requests bound to it
// that arrive later bring it back (their Add holds it).
void EngineLoop::DropIdleLanes() {
  for (size_t i = lanes_.size(); i-- > 1;) {
    if (!lanes_[i]->HasUnfinished()) lanes_.erase(lanes_.begin() + static_cast<ptrdiff_t>(i));
  }
}

void EngineLoop::ApplyResets() {
  int64_t asked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    asked = resets_asked_;
    if (asked == resets_done_) return;
  }
  int32_t blocks = 0;
  for (const auto& lane : lanes_) blocks += lane->ResetPrefixCache();
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
    std::shared_ptr<Engine> adopt;
    int64_t switches = 0;
    bool stop, cancel_all;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: sleep until there is work. Busy: take what arrived during the last step.
      cv_.wait(lock, [&] {
        return stop_ || cancel_all_ || !adds_.empty() || !cancels_.empty() || resets_asked_ > resets_done_ ||
               switches_asked_ > switches_done_ || AnyUnfinished();
      });
      adds.swap(adds_);
      cancels.swap(cancels_);
      adopt = std::move(switch_to_);
      switches = switches_asked_;
      stop = stop_;
      cancel_all = stop_ || cancel_all_;
      cancel_all_ = false;
    }
    if (adopt != nullptr) {  // between steps: the new engine is current from here on
      std::erase_if(lanes_, [&](const std::shared_ptr<Engine>& l) { return l.get() == adopt.get(); });
      adopt->HandOffThreads();
      lanes_.insert(lanes_.begin(), std::move(adopt));
    }
    if (switches > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      switches_done_ = switches;
      reset_cv_.notify_all();
    }
    ApplyResets();  // before the adds: a request added in this iteration matches only what the reset left
    for (Add& add : adds) {
      const RequestId id = add.request.id;
      AddLane(add.lane);
      if (absl::Status st = add.lane->AddRequest(std::move(add.request)); !st.ok()) {
        RequestDelta refused;
        refused.finished = true;
        refused.error = st;
        refused.id = id;
        refused.final.id = id;
        if (hooks_.on_refused) hooks_.on_refused(id);
        add.stream->Push(std::move(refused));
        continue;
      }
      active_[id] = Active{std::move(add.stream), add.submit_ms, false, add.lane.get()};
    }
    if (cancel_all) {
      for (auto& [id, a] : active_) cancels.push_back(id);
    }
    for (RequestId id : cancels) {
      // Abort returns its output from the lane's next Step()
      if (auto it = active_.find(id); it != active_.end()) it->second.lane->Abort(id);
    }
    // Aborted requests come back from this step; on stop, nothing else is run (Step() returns
    // the aborted ones at once when no sequence is left). Each lane steps in turn.
    std::vector<RequestDelta> deltas;
    for (const auto& lane : lanes_) {
      if (lane != lanes_[0] && !lane->HasUnfinished()) continue;
      std::vector<RequestDelta> d = lane->Step();
      deltas.insert(deltas.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
    }
    double oldest_queued_ms = 0;
    for (const auto& [id, a] : active_) {
      if (!a.first_token) oldest_queued_ms = std::max(oldest_queued_ms, a.lane->NowMs() - a.submit_ms);
    }
    PublishSnapshot(oldest_queued_ms);
    PublishDeltas(std::move(deltas));
    DropIdleLanes();
    if (stop && active_.empty()) return;
  }
}

// The current lane's KV pool and counters; the requests of every lane.
void EngineLoop::PublishSnapshot(double oldest_queued_ms) {
  const Engine& current = *lanes_[0];
  int32_t running = 0, waiting = 0;
  for (const auto& l : lanes_) {
    running += l->scheduler().num_running();
    waiting += l->scheduler().num_waiting();
  }
  std::lock_guard<std::mutex> lock(mu_);
  const BlockManager& blocks = current.scheduler().blocks();
  snapshot_.num_running = running;
  snapshot_.num_waiting = waiting;
  snapshot_.kv_blocks_total = blocks.num_blocks();
  snapshot_.kv_blocks_used = blocks.num_blocks() - blocks.num_available();
  snapshot_.kv_blocks_peak = std::max(snapshot_.kv_blocks_peak, snapshot_.kv_blocks_used);
  snapshot_.num_preemptions = current.scheduler().num_preemptions();
  snapshot_.prefix_cache_queries = blocks.query_tokens();
  snapshot_.prefix_cache_hits = blocks.hit_tokens();
  snapshot_.oldest_queued_ms = oldest_queued_ms;
  snapshot_.stats = current.stats();
  num_running_.store(snapshot_.num_running, std::memory_order_relaxed);
  oldest_queued_ms_.store(oldest_queued_ms, std::memory_order_relaxed);
}

void EngineLoop::PublishDeltas(std::vector<RequestDelta> deltas) {
  for (RequestDelta& d : deltas) {
    auto it = active_.find(d.id);
    if (it == active_.end()) continue;
    Active& a = it->second;
    if (!a.first_token && !d.tokens.empty()) {
      a.first_token = true;
      if (hooks_.on_first_token) hooks_.on_first_token(a.lane->NowMs() - a.submit_ms);
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
