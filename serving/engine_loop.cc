#include "serving/engine_loop.h"

#include <algorithm>
#include <utility>

namespace specula {
namespace {

// Appends to `out` the UTF-8 of `s` that can be sent now, with each invalid byte replaced by
// U+FFFD (Protobuf strings and JSON must be valid UTF-8), and returns the bytes of `s` consumed.
// A multi-byte character cut at the end (a token may end inside one) waits for the next delta
// unless `last`.
size_t TakeUtf8(std::string_view s, bool last, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    size_t have = 1;
    while (n > 1 && have < n && i + have < s.size() && (static_cast<unsigned char>(s[i + have]) & 0xC0) == 0x80) ++have;
    if (n > 1 && have < n && i + have == s.size() && !last) return i;  // cut at the end: wait
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t j = 1; j < have; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[i + j]) & 0x3F);
    const bool valid = n == 1 || (n > 1 && have == n &&
                                  ((n == 2 && cp >= 0x80) || (n == 3 && cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) ||
                                   (n == 4 && cp >= 0x10000 && cp <= 0x10FFFF)));
    if (valid) {
      out->append(s.substr(i, n));
      i += n;
    } else {
      out->append(kReplacement);
      ++i;
    }
  }
  return i;
}

}  // namespace

std::optional<TokenDelta> RequestStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !deltas_.empty() || done_; });
  if (deltas_.empty()) return std::nullopt;
  TokenDelta d = std::move(deltas_.front());
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

void RequestStream::Push(TokenDelta d) {
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

EngineLoop::EngineLoop(Engine* engine, LoopHooks hooks)
    : engine_(engine), hooks_(std::move(hooks)), thread_([this] { Run(); }) {}

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
        return stop_ || cancel_all_ || !adds_.empty() || !cancels_.empty() || engine_->HasUnfinished();
      });
      adds.swap(adds_);
      cancels.swap(cancels_);
      stop = stop_;
      cancel_all = stop_ || cancel_all_;
      cancel_all_ = false;
    }
    for (Add& add : adds) {
      const RequestId id = add.request.id;
      size_t hold_back = 0;
      for (const std::string& s : add.request.stop_strings) hold_back = std::max(hold_back, std::max<size_t>(s.size(), 1) - 1);
      if (absl::Status st = engine_->AddRequest(std::move(add.request)); !st.ok()) {
        TokenDelta refused;
        refused.finished = true;
        refused.error = st;
        refused.final.id = id;
        if (hooks_.on_refused) hooks_.on_refused(id);
        add.stream->Push(std::move(refused));
        continue;
      }
      active_[id] = Active{std::move(add.stream), add.submit_ms, 0, 0, hold_back};
    }
    if (cancel_all) {
      for (auto& [id, a] : active_) cancels.push_back(id);
    }
    for (RequestId id : cancels) {
      if (active_.count(id)) engine_->Abort(id);  // Abort returns its output from the next Step()
    }
    // Aborted requests come back from this step; on stop, nothing else is run (Step() returns
    // the aborted ones at once when no sequence is left).
    std::vector<RequestOutput> finished = engine_->Step();
    double oldest_queued_ms = 0;
    for (const auto& [id, a] : active_) {
      if (a.tokens_sent == 0) oldest_queued_ms = std::max(oldest_queued_ms, engine_->NowMs() - a.submit_ms);
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
    PublishDeltas(std::move(finished));
    if (stop && active_.empty()) return;
  }
}

void EngineLoop::PublishDeltas(std::vector<RequestOutput> finished) {
  auto delta_of = [this](Active& a, const RequestOutput& out, bool last) {
    TokenDelta d;
    if (a.tokens_sent == 0 && !out.tokens.empty() && hooks_.on_first_token) {
      hooks_.on_first_token(engine_->NowMs() - a.submit_ms);
    }
    d.tokens.assign(out.tokens.begin() + std::min(a.tokens_sent, out.tokens.size()), out.tokens.end());
    // Until the end, the last hold_back bytes wait: they may be the start of a stop string, which
    // the engine cuts from the final text. With them held, the deltas' text adds up to the final
    // text and never holds a stop string.
    const size_t sendable = last ? out.text.size() : out.text.size() - std::min(out.text.size(), a.hold_back);
    if (sendable > a.text_sent) {
      a.text_sent += TakeUtf8(std::string_view(out.text).substr(a.text_sent, sendable - a.text_sent), last, &d.text);
    }
    a.tokens_sent = std::max(a.tokens_sent, out.tokens.size());
    return d;
  };
  for (RequestOutput& out : finished) {
    auto it = active_.find(out.id);
    if (it == active_.end()) continue;
    TokenDelta d = delta_of(it->second, out, true);
    d.finished = true;
    out.arrival_ms = it->second.submit_ms;  // the client's view: from Submit, not from the step that admitted it
    d.final = out;
    // The hook first: what it counts (metrics, requests in flight) is current by the time the
    // client sees its last delta and sends the next request.
    if (hooks_.on_finished) hooks_.on_finished(out);
    it->second.stream->Push(std::move(d));
    active_.erase(it);
  }
  for (auto& [id, a] : active_) {
    const RequestOutput* out = engine_->Peek(id);
    if (out == nullptr || out->tokens.size() <= a.tokens_sent) continue;
    a.stream->Push(delta_of(a, *out, false));
  }
}

}  // namespace specula
