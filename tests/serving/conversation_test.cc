// Multi-turn conversations without a server: routing, the history each turn sends, a failed turn
// ending its session only, the concurrency bound, user messages, the per-turn statistics, and where
// sessions landed among replicas.
#include "serving/conversation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "nlohmann/json.hpp"

namespace specula {
namespace {

TEST(TurnRouting, RotateMovesEachTurnAndSessionStays) {
  for (int32_t s = 0; s < 5; ++s) {
    const std::string id = SessionId(3, s);
    for (int32_t t = 0; t < 6; ++t) {
      EXPECT_EQ(RouteTurn(TurnRouting::kRotate, id, s, t, 3), (s + t) % 3);
      EXPECT_EQ(RouteTurn(TurnRouting::kSession, id, s, t, 3), RouteTurn(TurnRouting::kSession, id, s, 0, 3));
    }
  }
  std::set<int32_t> used;  // session affinity still spreads sessions
  for (int32_t s = 0; s < 32; ++s) used.insert(RouteTurn(TurnRouting::kSession, SessionId(0, s), s, 0, 4));
  EXPECT_EQ(used.size(), 4u);
  EXPECT_EQ(RouteTurn(TurnRouting::kRotate, "x", 7, 3, 1), 0);
  EXPECT_EQ(SessionId(42, 7), "s42-7");
  EXPECT_EQ(*ParseTurnRouting("rotate"), TurnRouting::kRotate);
  EXPECT_EQ(*ParseTurnRouting("session"), TurnRouting::kSession);
  EXPECT_EQ(ParseTurnRouting("bogus").status().message(), "'bogus' is not session or rotate");
}

// Answers "a<session>.<turn>" with one output token per user message so far; fails every turn sent
// to it while `fail` is set; records what each turn sent and how many ran at once.
class ScriptedClient : public LoadClient {
 public:
  explicit ScriptedClient(bool fail = false) : fail_(fail) {}
  const ServerInfo& info() const override { return info_; }
  RequestResult Send(const LoadRequest& r) override {
    const int now = ++in_flight;
    for (int m = max_in_flight; now > m && !max_in_flight.compare_exchange_weak(m, now);) {}
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    --in_flight;
    {
      std::lock_guard lock(mu);
      sent.push_back(r);
    }
    if (fail_) return RequestResult{.outcome = Outcome::kFailed, .error = "down"};
    int32_t users = 0;
    for (const LoadMessage& m : r.messages) users += m.role == "user";
    return RequestResult{.outcome = Outcome::kOk, .ttft_s = 0.001 * (r.session.turn + 1), .e2e_s = 0.01,
                         .prompt_tokens = 10 * users, .cached_tokens = 5 * r.session.turn, .output_tokens = users,
                         .text = "a" + std::to_string(r.session.index) + "." + std::to_string(r.session.turn)};
  }
  std::mutex mu;
  std::vector<LoadRequest> sent;
  std::atomic<int> in_flight{0}, max_in_flight{0};

 private:
  const bool fail_;
  ServerInfo info_;
};

TEST(RunConversations, EachTurnSendsTheHistoryAndTheAnswerReceived) {
  ConversationOptions opt{.num_sessions = 3, .turns = 4, .system_prompt = "be brief", .user_words = 5,
                          .max_tokens = 7, .ignore_eos = true, .seed = 9};
  ScriptedClient client;
  ConversationRun run(opt);
  int32_t progress = 0;
  opt.on_progress = [&](int32_t done, int32_t total) {
    EXPECT_EQ(total, 12);
    progress = done;
  };
  RunConversations({&client}, opt, &run);
  EXPECT_EQ(progress, 12);
  EXPECT_EQ(run.sessions_completed, 3);
  EXPECT_EQ(run.sessions_failed, 0);
  ASSERT_EQ(client.sent.size(), 12u);
  for (int32_t s = 0; s < 3; ++s) {
    for (int32_t t = 0; t < 4; ++t) {
      const LoadRequest& r = run.requests[s * 4 + t];
      SCOPED_TRACE(testing::Message() << "session " << s << " turn " << t);
      EXPECT_EQ(r.session.id, "s9-" + std::to_string(s));
      EXPECT_EQ(r.session.index, s);
      EXPECT_EQ(r.session.turn, t);
      EXPECT_EQ(r.max_tokens, 7);
      EXPECT_TRUE(r.ignore_eos);
      // system, then user and assistant alternating, ending with the new user message.
      ASSERT_EQ(r.messages.size(), 2u + 2 * t);
      EXPECT_EQ(r.messages[0].role, "system");
      EXPECT_EQ(r.messages[0].content, "be brief");
      for (int32_t i = 0; i < t; ++i) {
        EXPECT_EQ(r.messages[1 + 2 * i].role, "user");
        EXPECT_EQ(r.messages[2 + 2 * i].role, "assistant");
        EXPECT_EQ(r.messages[2 + 2 * i].content, "a" + std::to_string(s) + "." + std::to_string(i));
      }
      EXPECT_EQ(r.messages.back().role, "user");
      EXPECT_EQ(std::count(r.messages.back().content.begin(), r.messages.back().content.end(), ' '), 4);  // 5 words
      if (t > 0) {  // the previous turn's messages, unchanged, lead this one
        const LoadRequest& before = run.requests[s * 4 + t - 1];
        for (size_t i = 0; i < before.messages.size(); ++i) EXPECT_EQ(r.messages[i].content, before.messages[i].content);
      }
      EXPECT_EQ(run.endpoints[s * 4 + t], 0);
      EXPECT_GE(run.results[s * 4 + t].send_s, t > 0 ? run.results[s * 4 + t - 1].send_s : 0.0);
    }
  }
  // Synthetic user messages differ between turns and sessions, and repeat for the same seed.
  EXPECT_NE(run.requests[0].messages[1].content, run.requests[4].messages[1].content);
  ConversationRun again(opt);
  ScriptedClient other;
  RunConversations({&other}, opt, &again);
  EXPECT_EQ(again.requests[5].messages.back().content, run.requests[5].messages.back().content);
}

TEST(RunConversations, AFailedTurnEndsItsSessionOnly) {
  // Two endpoints, the second down; rotate: session s starts on endpoint s % 2.
  ConversationOptions opt{.num_sessions = 4, .turns = 3, .routing = TurnRouting::kRotate};
  ScriptedClient up, down(/*fail=*/true);
  ConversationRun run(opt);
  int32_t progress = 0;
  opt.on_progress = [&](int32_t done, int32_t) { progress = done; };
  RunConversations({&up, &down}, opt, &run);
  EXPECT_EQ(progress, 12);  // the turns a failure skipped count as done
  EXPECT_EQ(run.sessions_completed, 0);
  EXPECT_EQ(run.sessions_failed, 4);
  for (int32_t s = 0; s < 4; ++s) {
    // Even sessions: turn 0 on the live endpoint, turn 1 on the dead one; odd: turn 0 fails.
    const int32_t sent = s % 2 == 0 ? 2 : 1;
    for (int32_t t = 0; t < 3; ++t) {
      SCOPED_TRACE(testing::Message() << "session " << s << " turn " << t);
      EXPECT_EQ(run.endpoints[s * 3 + t], t < sent ? (s + t) % 2 : -1);
      if (t < sent) EXPECT_EQ(run.results[s * 3 + t].outcome, t + 1 < sent ? Outcome::kOk : Outcome::kFailed);
    }
  }
  EXPECT_EQ(run.SentOrder().size(), 6u);
  const std::vector<TurnSummary> turns = SummarizeTurns(run);
  ASSERT_EQ(turns.size(), 3u);
  EXPECT_EQ(turns[0].sent, 4);
  EXPECT_EQ(turns[0].completed, 2);
  EXPECT_EQ(turns[0].failed, 2);
  EXPECT_EQ(turns[1].sent, 2);
  EXPECT_EQ(turns[1].failed, 2);
  EXPECT_EQ(turns[2].sent, 0);

  // Session affinity: the sessions hashed to the dead endpoint end at turn 0; the others finish.
  opt.routing = TurnRouting::kSession;
  ConversationRun sticky(opt);
  RunConversations({&up, &down}, opt, &sticky);
  int32_t on_down = 0;
  for (int32_t s = 0; s < 4; ++s) on_down += RouteTurn(TurnRouting::kSession, SessionId(0, s), s, 0, 2) == 1;
  EXPECT_EQ(sticky.sessions_failed, on_down);
  EXPECT_EQ(sticky.sessions_completed, 4 - on_down);
}

TEST(RunConversations, SessionConcurrencyAndThinkTime) {
  ConversationOptions opt{.num_sessions = 6, .turns = 2, .session_concurrency = 2, .think_time_s = 0.03};
  ScriptedClient client;
  ConversationRun run(opt);
  const auto t0 = std::chrono::steady_clock::now();
  RunConversations({&client}, opt, &run);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(client.max_in_flight, 2);
  EXPECT_EQ(run.sessions_completed, 6);
  EXPECT_GE(took, 3 * 0.03);  // 3 rounds of 2 sessions, each with one pause
  for (int32_t s = 0; s < 6; ++s) {
    const RequestResult& first = run.results[s * 2];
    EXPECT_GE(run.results[s * 2 + 1].send_s - first.send_s, 0.03 + 0.005 * 0.9) << s;  // answer, then the pause
  }
  EXPECT_GE(run.duration_s, took * 0.5);
  EXPECT_LE(run.duration_s, took);
}

TEST(RunConversations, UserMessagesAreCycledBySessionAndTurn) {
  const std::string path = ::testing::TempDir() + "/conversation_users.jsonl";
  std::ofstream(path) << "\"first\"\n\n{\"content\": \"second\"}\n{\"prompt\": \"third\"}\n";
  auto messages = LoadUserMessages(path);
  ASSERT_TRUE(messages.ok()) << messages.status();
  EXPECT_EQ(*messages, (std::vector<std::string>{"first", "second", "third"}));
  ConversationOptions opt{.num_sessions = 2, .turns = 2, .user_messages = *messages};
  ScriptedClient client;
  ConversationRun run(opt);
  RunConversations({&client}, opt, &run);
  // Turn t of session s takes line (s * turns + t) % 3.
  EXPECT_EQ(run.requests[0].messages.back().content, "first");
  EXPECT_EQ(run.requests[1].messages.back().content, "second");
  EXPECT_EQ(run.requests[2].messages.back().content, "third");
  EXPECT_EQ(run.requests[3].messages.back().content, "first");
  EXPECT_EQ(run.requests[0].messages.size(), 1u);  // no system prompt: the user message alone

  std::ofstream(path) << "\"ok\"\n{\"content\": 3}\n";
  EXPECT_NE(LoadUserMessages(path).status().message().find(":2: not a user message"), std::string::npos);
  std::ofstream(path) << "\n";
  EXPECT_NE(LoadUserMessages(path).status().message().find("no user messages"), std::string::npos);
  EXPECT_NE(LoadUserMessages("/nope.jsonl").status().message().find("/nope.jsonl"), std::string::npos);
}

TEST(SummarizeTurns, StatisticsByTurnIndex) {
  ConversationOptions opt{.num_sessions = 3, .turns = 3};
  ScriptedClient client;
  ConversationRun run(opt);
  RunConversations({&client}, opt, &run);
  const std::vector<TurnSummary> turns = SummarizeTurns(run);
  ASSERT_EQ(turns.size(), 3u);
  for (int32_t t = 0; t < 3; ++t) {
    EXPECT_EQ(turns[t].sent, 3);
    EXPECT_EQ(turns[t].completed, 3);
    EXPECT_NEAR(turns[t].ttft_ms.mean, t + 1, 1e-9);  // the script's TTFT: (turn + 1) ms
    EXPECT_NEAR(turns[t].ttft_ms.p90, t + 1, 1e-9);
    EXPECT_DOUBLE_EQ(turns[t].mean_prompt_tokens, 10.0 * (t + 1));
    EXPECT_DOUBLE_EQ(turns[t].mean_cached_tokens, 5.0 * t);
    EXPECT_DOUBLE_EQ(turns[t].mean_output_tokens, t + 1);
  }
  const nlohmann::json j = TurnsJson(turns);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[2]["turn"], 2);
  EXPECT_EQ(j[2]["completed"], 3);
  EXPECT_DOUBLE_EQ(j[2]["mean_cached_tokens"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j[1]["median_ttft_ms"].get<double>(), 2.0);
  // The sent turns in the order sent, each session's turns in turn order.
  const RunResult sent = run.Sent();
  ASSERT_EQ(sent.requests.size(), 9u);
  for (size_t i = 1; i < sent.requests.size(); ++i) EXPECT_GE(sent.requests[i].send_s, sent.requests[i - 1].send_s);
}

// Where sessions landed: turn 0's replica counts its session (whatever the outcome, if the answer
// named one); a session moved when its completed turns named two replicas or more.
TEST(SummarizeSessionReplicas, FirstTurnsAndMovedSessions) {
  ConversationRun run(ConversationOptions{.num_sessions = 5, .turns = 3});
  auto turn = [&](int32_t session, int32_t t, Outcome outcome, const std::string& replica) {
    const size_t k = static_cast<size_t>(session) * 3 + t;
    run.endpoints[k] = 0;
    run.results[k].outcome = outcome;
    run.results[k].replica = replica;
  };
  for (int32_t t = 0; t < 3; ++t) turn(0, t, Outcome::kOk, "a");  // stays on a
  turn(1, 0, Outcome::kOk, "a");                                    // moves from a to b
  turn(1, 1, Outcome::kOk, "b");
  turn(1, 2, Outcome::kOk, "b");
  turn(2, 0, Outcome::kRejected, "b");                              // refused at once: first on b
  turn(3, 0, Outcome::kOk, "b");                                    // a failed turn elsewhere does not move it
  turn(3, 1, Outcome::kFailed, "a");
  turn(4, 0, Outcome::kOk, "");                                     // no replica named: neither
  turn(4, 1, Outcome::kOk, "a");
  const SessionReplicas s = SummarizeSessionReplicas(run);
  EXPECT_EQ(s.first_turns, (std::map<std::string, int32_t>{{"a", 2}, {"b", 2}}));
  EXPECT_EQ(s.moved, 1);
}

}  // namespace
}  // namespace specula
