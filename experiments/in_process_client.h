// A load client that submits straight to the serving core (no sockets): in-process ONLINE runs,
// and a calibration's served traffic, go through the same client and load generator. A
// conversation's turn is submitted as one prompt (ConversationPrompt), as gRPC sends it.
#pragma once

#include <mutex>
#include <vector>

#include "serving/load_gen.h"
#include "serving/server.h"

namespace specula::experiments {

class InProcessClient : public LoadClient {
 public:
  InProcessClient(Server* server, const std::vector<LoadRequest>* requests, double temperature, uint64_t seed)
      : server_(server), requests_(requests), temperature_(temperature), seed_(seed), tokens_(requests->size()) {
    info_.model = "in-process";
  }
  const ServerInfo& info() const override { return info_; }

  // RunLoad (and RunConversations) pass the elements of *requests: `request` must be one of them.
  RequestResult Send(const LoadRequest& request) override;

  std::vector<std::vector<TokenId>> tokens();  // [requests]: each one's output tokens

 private:
  Server* server_;
  const std::vector<LoadRequest>* requests_;
  const double temperature_;
  const uint64_t seed_;
  ServerInfo info_;
  std::mutex mu_;
  std::vector<std::vector<TokenId>> tokens_;  // [requests], guarded by mu_
};

}  // namespace specula::experiments
