// Multi-turn conversations: sessions on a pool of threads, each session's turns one after another.
#include "serving/conversation.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Short common words: a synthetic user message reads as text to any tokenizer, about a token each.
constexpr const char* kWords[] = {
    "the", "cat", "dog", "sun", "tree", "house", "little", "big", "red", "blue", "happy", "sad",
    "girl", "boy", "mom", "dad", "ball", "park", "day", "night", "play", "run", "jump", "see",
    "look", "find", "friend", "bird", "fish", "water", "cake", "book", "toy", "car", "box", "hat",
    "and", "with", "in", "on", "to", "was", "had", "said", "went", "saw", "liked", "wanted",
    "one", "two", "good", "new", "old", "small", "long", "fast", "slow", "warm", "cold", "soft"};

// The text of turn `turn` of session `index`.
std::string UserMessage(const ConversationOptions& opt, int32_t index, int32_t turn) {
  const int64_t k = static_cast<int64_t>(index) * opt.turns + turn;
  if (!opt.user_messages.empty()) return opt.user_messages[k % opt.user_messages.size()];
  std::mt19937_64 rng(opt.seed * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(k) * 0xbf58476d1ce4e5b9ull);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::string out;
  for (int32_t i = 0; i < opt.user_words; ++i) absl::StrAppend(&out, i == 0 ? "" : " ", kWords[word(rng)]);
  return out;
}

}  // namespace

absl::StatusOr<TurnRouting> ParseTurnRouting(const std::string& name) {
  if (name == "session") return TurnRouting::kSession;
  if (name == "rotate") return TurnRouting::kRotate;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not session or rotate"));
}

const char* TurnRoutingName(TurnRouting r) { return r == TurnRouting::kRotate ? "rotate" : "session"; }

int32_t RouteTurn(TurnRouting routing, const std::string& id, int32_t index, int32_t turn, int32_t n) {
  if (n <= 1) return 0;
  if (routing == TurnRouting::kRotate) return static_cast<int32_t>((static_cast<int64_t>(index) + turn) % n);
  uint64_t h = 1469598103934665603ull;  // FNV-1a: the same endpoint for an id on every machine
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  // MurmurHash3's finalizer: FNV-1a's low bits follow the last characters' (its parity is the last
  // digit's), which would put sessions on a power-of-two fleet in lockstep with their numbers.
  h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
  h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<int32_t>(h % static_cast<uint64_t>(n));
}

std::string SessionId(uint64_t seed, int32_t index) { return absl::StrCat("s", seed, "-", index); }

absl::StatusOr<std::vector<std::string>> LoadUserMessages(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<std::string> out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const nlohmann::json* text = &j;
    if (j.is_object()) text = j.contains("content") ? &j["content"] : j.contains("prompt") ? &j["prompt"] : nullptr;
    if (j.is_discarded() || text == nullptr || !text->is_string() || text->get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": not a user message (a JSON string, or an object with a non-empty \"content\")"));
    }
    out.push_back(text->get<std::string>());
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no user messages"));
  return out;
}

ConversationRun::ConversationRun(const ConversationOptions& opt) : turns(opt.turns) {
  const size_t n = static_cast<size_t>(std::max(opt.num_sessions, 0)) * std::max(opt.turns, 0);
  requests.resize(n);
  results.resize(n);
  endpoints.assign(n, -1);
}

std::vector<size_t> ConversationRun::SentOrder() const {
  std::vector<size_t> order;  // [turns sent]: slots
  for (size_t k = 0; k < endpoints.size(); ++k) {
    if (endpoints[k] >= 0) order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return results[a].send_s < results[b].send_s; });
  return order;
}

RunResult ConversationRun::Sent() const {
  RunResult run;
  run.duration_s = duration_s;
  run.start_s = start_s;
  for (size_t k : SentOrder()) run.requests.push_back(results[k]);
  return run;
}

namespace {

// One run's shared state: the clock, the lock over the run's totals, and the progress count.
struct Driver {
  Driver(const std::vector<LoadClient*>& clients, const ConversationOptions& opt, ConversationRun* run)
      : clients(clients), opt(opt), run(run), t0(Clock::now()) {}

  const std::vector<LoadClient*>& clients;
  const ConversationOptions& opt;
  ConversationRun* run;
  Clock::time_point t0;
  std::mutex mu;
  int32_t done = 0;

  void Progress(int32_t turns_done, double end_s) {
    std::lock_guard lock(mu);
    run->duration_s = std::max(run->duration_s, end_s);
    done += turns_done;
    if (opt.on_progress) opt.on_progress(done, static_cast<int32_t>(run->requests.size()));
  }

  bool Stopped() const { return opt.stop != nullptr && opt.stop->load(); }

  // Session `index`, turn by turn, closed loop.
  void Session(int32_t index) {
    const std::string id = SessionId(opt.seed, index);
    std::vector<LoadMessage> history;  // [messages so far]
    if (!opt.system_prompt.empty()) history.push_back({"system", opt.system_prompt});
    for (int32_t t = 0; t < opt.turns; ++t) {
      if (t > 0 && opt.think_time_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(opt.think_time_s));
      if (Stopped()) return Progress(opt.turns - t, Since(t0));
      history.push_back({"user", UserMessage(opt, index, t)});
      const size_t k = static_cast<size_t>(index) * opt.turns + t;
      LoadRequest& r = run->requests[k];
      r.messages = history;
      r.max_tokens = opt.max_tokens;
      r.ignore_eos = opt.ignore_eos;
      r.session = {id, index, t};
      const int32_t e = RouteTurn(opt.routing, id, index, t, static_cast<int32_t>(clients.size()));
      run->endpoints[k] = e;
      const double sent = Since(t0);
      RequestResult res = clients[e]->Send(r);
      res.send_s = sent;
      const bool ok = res.outcome == Outcome::kOk;
      history.push_back({"assistant", res.text});
      run->results[k] = std::move(res);
      if (!ok) {
        {
          std::lock_guard lock(mu);
          ++run->sessions_failed;
        }
        return Progress(opt.turns - t, Since(t0));
      }
      Progress(1, Since(t0));
    }
    std::lock_guard lock(mu);
    ++run->sessions_completed;
  }
};

}  // namespace

void RunConversations(const std::vector<LoadClient*>& clients, const ConversationOptions& opt, ConversationRun* run) {
  if (clients.empty() || opt.num_sessions <= 0 || opt.turns <= 0) return;
  Driver d(clients, opt, run);
  const int32_t limit = opt.session_concurrency > 0 ? opt.session_concurrency : kMaxInFlightDefault;
  const int32_t workers = std::min(opt.num_sessions, limit);
  std::atomic<int32_t> next{0};
  run->start_s = std::chrono::duration<double>(d.t0.time_since_epoch()).count();
  std::vector<std::thread> pool;  // [workers]
  for (int32_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (int32_t s; (s = next++) < opt.num_sessions;) d.Session(s);
    });
  }
  for (std::thread& t : pool) t.join();
}

std::vector<TurnSummary> SummarizeTurns(const ConversationRun& run) {
  std::vector<TurnSummary> out(std::max(run.turns, 0));  // [turns]
  for (int32_t t = 0; t < run.turns; ++t) {
    TurnSummary& s = out[t];
    s.turn = t;
    std::vector<double> ttft;  // [completed turns of this index], ms
    double prompt = 0, cached = 0, output = 0;
    for (size_t k = t; k < run.results.size(); k += run.turns) {
      if (run.endpoints[k] < 0) continue;
      ++s.sent;
      const RequestResult& r = run.results[k];
      if (r.outcome != Outcome::kOk) {
        ++s.failed;
        continue;
      }
      ++s.completed;
      ttft.push_back(r.ttft_s * 1e3);
      prompt += r.prompt_tokens;
      cached += r.cached_tokens;
      output += r.output_tokens;
    }
    if (s.completed > 0) {
      s.mean_prompt_tokens = prompt / s.completed;
      s.mean_cached_tokens = cached / s.completed;
      s.mean_output_tokens = output / s.completed;
    }
    s.ttft_ms = Summarize(std::move(ttft));
  }
  return out;
}

SessionReplicas SummarizeSessionReplicas(const ConversationRun& run) {
  SessionReplicas out;
  for (size_t first = 0; run.turns > 0 && first < run.results.size(); first += run.turns) {
    if (run.endpoints[first] >= 0 && !run.results[first].replica.empty()) ++out.first_turns[run.results[first].replica];
    std::set<std::string> answered;  // the replicas named by the session's completed turns
    for (size_t k = first; k < first + run.turns; ++k) {
      const RequestResult& r = run.results[k];
      if (run.endpoints[k] >= 0 && r.outcome == Outcome::kOk && !r.replica.empty()) answered.insert(r.replica);
    }
    if (answered.size() > 1) ++out.moved;
  }
  return out;
}

nlohmann::json TurnsJson(const std::vector<TurnSummary>& turns) {
  nlohmann::json out = nlohmann::json::array();
  for (const TurnSummary& t : turns) {
    out.push_back({{"turn", t.turn}, {"sent", t.sent}, {"completed", t.completed}, {"failed", t.failed},
                   {"mean_ttft_ms", t.ttft_ms.mean}, {"median_ttft_ms", t.ttft_ms.median}, {"p90_ttft_ms", t.ttft_ms.p90},
                   {"mean_prompt_tokens", t.mean_prompt_tokens}, {"mean_cached_tokens", t.mean_cached_tokens},
                   {"mean_output_tokens", t.mean_output_tokens}});
  }
  return out;
}

}  // namespace specula
