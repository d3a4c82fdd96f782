#include "spec/adaptive.h"

#include <algorithm>
#include <utility>

#include "spec/tuning.h"

namespace specula {

absl::StatusOr<std::unique_ptr<AdaptiveSpeculation>> AdaptiveSpeculation::Create(
    const AdaptiveConfig& config, const ForwardShape& target, std::optional<ForwardShape> draft_shape,
    MeasureCostFn measure_target, MeasureCostFn measure_draft) {
  std::unique_ptr<AdaptiveSpeculation> s(new AdaptiveSpeculation(config, target));
  s->target_meter_.measure = std::move(measure_target);
  s->draft_meter_.measure = std::move(measure_draft);
  const double t0 = s->clock_->NowSeconds();
  if (auto st = s->Calibrate(draft_shape); !st.ok()) return st;
  s->measure_seconds_ = s->clock_->NowSeconds() - t0;
  return s;
}

absl::Status AdaptiveSpeculation::Calibrate(std::optional<ForwardShape> draft_shape) {
  grid_ = CostGrid{std::min(config_.max_num_seqs, 8), config_.block_size, config_.calibration_seconds,
                   tuning::kStartupTokens};
  // The points of a meter's first measurement (or those given) and what is left to measure.
  auto first = [](Meter* m, const std::optional<std::vector<CostPoint>>& given,
                  const CostGrid& grid) -> absl::StatusOr<std::vector<CostPoint>> {
    if (given.has_value()) return *given;  // never measured: the meter stays done
    auto points = m->measure(grid);
    if (points.ok() && !points->empty()) *m = Meter{points->back().tokens, points->back().seconds, false, m->measure};
    return points;
  };
  auto target = first(&target_meter_, config_.target_cost, grid_);
  if (!target.ok()) return target.status();
  std::unique_ptr<StepCost> draft;
  if (draft_shape.has_value()) {
    // The draft's one-token forward first: whether drafts could pay at all depends on it alone
    // (each draft is one token, after a catch-up of about one); its larger shapes are measured
    // below only where drafts could pay.
    CostGrid one = grid_;
    one.max_tokens = 1;
    auto points = first(&draft_meter_, config_.draft_cost, one);
    if (!points.ok()) return points.status();
    draft = std::make_unique<StepCost>(*points);
  }
  controller_ = std::make_unique<SpecController>(target_, StepCost(*target), draft_shape, std::move(draft));
  // Whether drafts could pay at all, even every one accepted; where only shapes past those
  // measured could tell, the next ones are measured now.
  while (!controller_->DraftsCouldPay(config_.max_num_seqs, config_.max_spec_tokens)) {
    if (!controller_->wants_larger_shapes()) {
      drafts_cannot_pay_ = true;
      return absl::OkStatus();  // nothing more to measure
    }
    if (!MeasureNext(&target_meter_)) break;  // cannot tell: auto as usual
  }
  // A batch of up to 8 sequences has its step with one draft each measured now: until it is, such
  // a batch runs plain steps, and the draft then lags so far behind (its first forward runs the
  // tokens it skipped) that whole waves of requests never draft. Larger batches measure theirs
  // between steps.
  while (config_.max_num_seqs <= grid_.batch && target_meter_.tokens < 2 * config_.max_num_seqs &&
         MeasureNext(&target_meter_)) {
  }
  while (draft_meter_.tokens < grid_.max_tokens && MeasureNext(&draft_meter_)) {  // false once done
  }
  return absl::OkStatus();
}

bool AdaptiveSpeculation::MeasureNext(Meter* m) {
  if (m->done) return false;
  CostGrid grid = grid_;
  grid.max_tokens = 2 * m->tokens;
  const double t0 = clock_->NowSeconds();
  auto points = m->measure(grid);
  const double seconds = clock_->NowSeconds() - t0;
  between_steps_seconds_ += seconds;
  measure_seconds_ += seconds;
  if (!points.ok() || points->empty() || points->back().tokens <= m->tokens) {
    m->done = true;  // the largest shape (or the budget) reached; a failure keeps the table it has
    return false;
  }
  m->tokens = points->back().tokens;
  m->seconds = points->back().seconds;
  if (m == &target_meter_) {
    controller_->SetTargetPoints(std::move(points).value());
  } else {
    controller_->SetDraftPoints(std::move(points).value());
  }
  return true;
}

void AdaptiveSpeculation::MeasureMore(double step_seconds) {
  step_seconds_ += step_seconds;
  for (Meter* m : {&target_meter_, &draft_meter_}) {
    if (m->done) continue;
    // The next shape takes about twice the last one's time (2.5x measured on tiny models), three
    // runs; at once where the controller found a step that might gain past the measured shapes.
    const bool wanted = m == &target_meter_ && controller_->wants_larger_shapes();
    if (!wanted && between_steps_seconds_ + 6 * m->seconds > tuning::kMeasureShare * step_seconds_) return;
    if (MeasureNext(m)) return;  // one shape per step
  }
}

void AdaptiveSpeculation::MeasureRemaining() {
  if (drafts_cannot_pay_) return;  // its controller and measurements are off
  while (MeasureNext(&target_meter_)) {
  }
  while (MeasureNext(&draft_meter_)) {
  }
}

void AdaptiveSpeculation::Choose(StepPlan* plan, absl::Span<const SpecCandidate> candidates) {
  if (candidates.empty() || drafts_cannot_pay_) return;
  double tokens = 0, positions = 0;  // the step's work without drafts
  double fixed_tokens = 0;           // tokens the step yields besides the candidates'
  for (const ScheduledSeq& s : plan->seqs) {
    tokens += s.num_tokens - s.num_spec;
    positions += AttendedPositions(s.start_pos, s.num_tokens - s.num_spec);
    if (s.num_spec == 0) fixed_tokens += s.samples ? 1 : 0;
  }
  const double base = ForwardFlops(target_, tokens, static_cast<double>(plan->seqs.size()), positions);
  const std::vector<int32_t> k = controller_->Choose(base, fixed_tokens, candidates);
  for (size_t c = 0; c < candidates.size(); ++c) plan->SetNumSpec(candidates[c].plan_index, k[c]);
}

void AdaptiveSpeculation::Observe(const StepPlan& plan, absl::Span<const SpecCandidate> candidates,
                                  const StepResult& result, const StepTiming& timing) {
  if (drafts_cannot_pay_) return;
  // The outputs and the candidates are both in the plan's order, and every output with drafts is a
  // candidate's.
  const SpecCandidate* c = candidates.begin();
  for (const SeqOutput& o : result.outputs) {
    if (o.num_drafts <= 0) continue;
    while (c != candidates.end() && c->id != o.id) ++c;
    if (c == candidates.end()) break;
    // A verification yields its accepted drafts and one more token.
    controller_->ObserveAcceptance(c->acceptance, o.num_drafts, static_cast<int32_t>(o.new_tokens.size()) - 1);
  }
  if (config_.refine_cost) {
    std::vector<int32_t> k;  // [candidates]
    bool drafted = false;
    for (const SpecCandidate& c : candidates) {
      k.push_back(plan.seqs[c.plan_index].num_spec);
      drafted = drafted || k.back() > 0;
    }
    const bool draft_model = controller_->draft_cost() != nullptr;
    controller_->ObserveStep(ForwardFlops(target_, timing.tokens, timing.rows, timing.positions),
                             draft_model ? timing.seconds - timing.propose_seconds : timing.seconds,
                             controller_->DraftFlops(candidates, k), timing.propose_seconds, drafted);
  }
  MeasureMore(timing.seconds);
}

}  // namespace specula
