// The core part of a request's record: what the scheduler sees of it (tokens, how many have KV
// computed, its block table, its place in the lifecycle: waiting -> running -> finished, with
// preemption back to waiting). Its owner's record extends it (engine/request_record.h, sim/replica.h)
// with what the scheduler never reads; the scheduler holds pointers to it from Add to Finish.
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_hash.h"
#include "core/step.h"

namespace specula {

enum class SeqStatus { kWaiting, kRunning, kFinished };

struct SequenceState {
  SequenceState() = default;
  SequenceState(const SequenceState&) = delete;  // the scheduler and the plan point at it
  SequenceState& operator=(const SequenceState&) = delete;

  RequestId id = 0;
  int32_t priority = 0;        // lower is served first under the priority policy
  uint64_t arrival_order = 0;  // FCFS tie-break
  double arrival_ms = 0.0;
  std::vector<TokenId> tokens;  // prompt + generated
  int32_t num_prompt = 0;
  int32_t max_new_tokens = 0;
  std::vector<TokenId> stop_ids;
  bool skip_prefix_cache = false;  // never served from the prefix cache

  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish = FinishReason::kNone;
  int32_t num_computed = 0;     // tokens whose KV is in the cache
  std::vector<BlockId> blocks;  // block table
  BlockHash salt_root;          // the prefix chain's root (core/block_hash.h): its cache_salt's
  std::vector<BlockHash> block_hashes;  // [full blocks registered so far]: the prefix chain
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt = 0;  // prompt tokens served from the prefix cache (last admission)
  // The tokens a constrained request's grammar forces next (structured output): the scheduler
  // reserves a decode's draft slots for them even without a proposer, and they are drafted first.
  std::vector<TokenId> forced;

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - num_prompt; }
};

}  // namespace specula
