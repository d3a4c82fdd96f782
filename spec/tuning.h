// Adaptive speculation's tuning constants, in one place. Each says what it trades and the
// measurement that set it; change one only with the spec grid (bench/spec_bench) beside it.
#pragma once

#include <cstdint>

namespace specula::tuning {

// --- Measurement (spec/adaptive.cc) ---

// Shapes measured when the engine is built: 1, 2, 4, 8 tokens. Measuring up to 32 for batches past
// 4 took 18-19 ms for the tinystories pair against 3-8 ms, ~5% of a 32-prompt CLI job; the larger
// shapes come lazily instead.
inline constexpr int32_t kStartupTokens = 8;
// The share of the steps' time that measuring the larger shapes between steps may take: a short
// job pays ~1% for it, however large the models.
inline constexpr double kMeasureShare = 0.005;

// --- Acceptance (spec/controller.cc) ---

// Engine-wide, acceptance is Beta(1, 1) plus the counts of every verification, each decayed by this
// per verification.
inline constexpr double kEngineForget = 0.999;
// The highest acceptance a choice assumes (E(k) stays finite as alpha -> 1), and the one
// DraftsCouldPay asks about ("every draft accepted").
inline constexpr double kMaxAlpha = 0.99;
// Per request, the engine-wide mean counts as this many verifications. 8, not 4: a new request's
// draws from Beta(3.2, 0.8) (the engine at 0.8) spread so widely that a single sequence ran 3.5% of
// its steps without drafts and many with 1 or 2, where 4 did best.
inline constexpr double kRequestWeight = 8.0;

// --- Choice (spec/controller.cc) ---

// A target step is only predicted up to this multiple of its table's largest measured one (its
// factor learns only from such steps, and so does the draft's). The draft's forwards are predicted
// at any size: the table's extension overprices them, which errs on the safe side, and its first
// forward runs the tokens it lags by, which grow with every step without drafts; bounded too, ~8
// plain steps in a batch of 8 put every catch-up past the draft's reach, and auto then ran plain
// steps until new requests came.
inline constexpr double kReach = 2.0;
// The predicted gain a step with drafts must have over the plain step. Where every fixed k gained
// less than the cost model's error (synthetic pair, batch 8: k = 1 and 2 at 0.95-1.02x of no
// speculation), auto without it speculated on most steps in some runs and lost 6.5%.
inline constexpr double kMargin = 0.03;
// Per plain step, in logs: a premium learned for steps with drafts halves every ~350 plain steps,
// so that a price learned in a slow spell does not keep drafts off for good.
inline constexpr double kVerifyRelax = 0.002;
// After kOffRun plain choices in a row, only every kOffEvery-th step is evaluated: where drafts
// never pay, the draws and walks over 8 to 32 sequences took 5 us of steps of 100-400 us.
inline constexpr int32_t kOffRun = 8, kOffEvery = 4;
// The context of the startup measurement's forwards (model/forward_cost.cc), which DraftsCouldPay
// prices its steps at.
inline constexpr int32_t kMeasuredContext = 32;

// --- Cost tables (spec/step_cost.cc) ---

// A table's factor moves this far (in logs) toward each observation: it follows the last ~30 steps.
inline constexpr double kFactorRate = 0.03;
inline constexpr double kMinFactor = 0.1, kMaxFactor = 10.0;
// The correction by size learns faster, and is bounded tighter: it carries the shape, not the
// machine's speed.
inline constexpr double kCorrectionRate = 0.05;
inline constexpr double kMinCorrection = 0.5, kMaxCorrection = 2.0;

}  // namespace specula::tuning
