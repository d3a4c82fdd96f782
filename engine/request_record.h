// One record per request, owned once (Engine::records_): everything the engine keeps about a request
// from AddRequest until its last delta. Its core part (SequenceState, core/sequence.h: tokens, KV
// block table, lifecycle) is what the scheduler sees, through the pointers a step's plan carries;
// the rest the scheduler never reads. Each component's own state per request lives here and is
// handed to it with each call, so that finishing a request is one erase.
#pragma once

#include <optional>
#include <utility>

#include "constrain/constraint.h"
#include "core/sequence.h"
#include "draft/proposer.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "model/sampler.h"
#include "scheduler/scheduler.h"
#include "spec/controller.h"
#include "verify/rejection_sampler.h"

namespace specula {

// Shared KV (--kv-store): the fetch a request waits on before the scheduler takes it, and how far
// its blocks have been offered to the store.
struct KvStoreSlot {
  std::optional<NewSequence> admit;  // set while a fetch is pending: what Scheduler::Add takes after it
  std::vector<BlockHash> chain;      // [the prompt's full blocks]: the fetch asks for [from_block, size)
  int32_t from_block = 0;
  double fetch_start_ms = 0;
  int32_t num_offered = 0;           // full blocks written to (or known to be in) the store
};

struct RequestRecord : SequenceState {
  // `r` validated, with sampling.output_start set.
  RequestRecord(Request r, double now_ms)
      : request(std::move(r)), sampler(request.sampling), uniform(request.sampling.seed ^ 0x9e3779b97f4a7c15ull),
        output(StartOutput(request, now_ms)) {}

  Request request;
  Sampler sampler;            // plain samples
  Uniform uniform;            // verification randomness
  OutputState output;         // detokenizer, stop strings, hold-back, the output so far and its speculation statistics
  SpecAcceptance acceptance;  // adaptive speculation's estimate of this request's acceptance
  ProposerSlot proposer;      // the proposer's state (draft KV, suffix index); null until it drafts
  std::optional<ConstraintMatcher> matcher;  // structured output: where the tokens are in the constraint
  KvStoreSlot kv_store;       // shared KV: the prefix fetched for it, its blocks offered to the store
  bool aborted = false;       // ended between steps; its last delta comes from the next step
};

// The record of a sequence the engine scheduled (every sequence in its scheduler is one).
inline RequestRecord& RecordOf(const ScheduledSeq& s) { return *static_cast<RequestRecord*>(s.seq); }

}  // namespace specula
