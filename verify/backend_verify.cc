#include "verify/backend_verify.h"

#include <algorithm>

#include "core/status_macros.h"

namespace specula {
template <typename T>
absl::Status BackendVerifier::Upload(const std::vector<T>& host, BackendBuffer* dev) {
  RETURN_IF_ERROR(dev->Grow(be_, std::max<size_t>(host.size(), 1) * sizeof(T)));
  be_->CopyIn(dev->get(), host.data(), host.size() * sizeof(T));
  return absl::OkStatus();
}

absl::Status BackendVerifier::Run(const float* logits, int32_t rows, int32_t vocab,
                                  absl::Span<const RowsToVerify> seqs, double synthetic_alpha,
                                  std::vector<VerifyResult>* out) {
  status_ = absl::OkStatus();
  route_.assign(seqs.size(), Route::kHost);
  bool greedy = false, sampled = false;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SamplingParams& p = *seqs[i].params;
    if (!Sampler::BackendCanSample(p) || !seqs[i].host_rows.empty()) continue;
    route_[i] = p.temperature == 0.0f ? Route::kGreedy : Route::kSampled;
    greedy = greedy || route_[i] == Route::kGreedy;
    sampled = sampled || route_[i] == Route::kSampled;
  }
  if (greedy) LaunchArgmax(logits, rows, vocab);
  if (sampled) LaunchSample(logits, rows, vocab, seqs, synthetic_alpha);
  if (sampled && synthetic_alpha < 0) LaunchVerify(vocab, seqs);
  CopyHostRows(logits, vocab, seqs);
  status_.Update(be_->Sync());
  RETURN_IF_ERROR(status_);
  out->clear();
  for (size_t i = 0; i < seqs.size(); ++i) out->push_back(Collect(i, seqs[i], vocab, synthetic_alpha));
  return absl::OkStatus();
}

void BackendVerifier::LaunchArgmax(const float* logits, int32_t rows, int32_t vocab) {
  status_.Update(argmax_dev_.Grow(be_, std::max(rows, 1) * sizeof(int32_t)));
  if (!status_.ok()) return;
  argmax_.resize(rows);
  be_->Argmax(logits, rows, vocab, argmax_dev_.as<int32_t>());
  be_->CopyOut(argmax_.data(), argmax_dev_.get(), rows * sizeof(int32_t));
}

// Every row goes through Sample (rows of other sequences as greedy ones): one launch. A plain row
// takes its sampler's next draw; a synthetic sequence draws its acceptance here, on the host, and
// the row after its accepted drafts takes the next draw of its stream, as Verify's do.
void BackendVerifier::LaunchSample(const float* logits, int32_t rows, int32_t vocab,
                                   absl::Span<const RowsToVerify> seqs, double synthetic_alpha) {
  sample_rows_.Reset(rows);
  accepted_.assign(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (route_[i] != Route::kSampled) continue;
    const RowsToVerify& s = seqs[i];
    const int32_t k = static_cast<int32_t>(s.draft.tokens.size());
    for (int32_t r = s.first_row; r <= s.first_row + k; ++r) {
      sample_rows_.Set(r, s.params->temperature, s.params->top_k, s.params->top_p);
    }
    if (k == 0) {
      sample_rows_.SetDraw(s.first_row, s.sampler->Draw());
    } else if (synthetic_alpha >= 0) {
      accepted_[i] = SyntheticAccepted(k, synthetic_alpha, *s.uniform);
      sample_rows_.SetDraw(s.first_row + accepted_[i], s.uniform->Next());
    }
  }
  status_.Update(probs_dev_.Grow(be_, std::max<size_t>(static_cast<size_t>(rows) * vocab, 1) * sizeof(float)));
  status_.Update(sampled_dev_.Grow(be_, std::max(rows, 1) * sizeof(int32_t)));
  absl::StatusOr<SampleArgs> args = sample_rows_.Upload(be_);
  status_.Update(args.status());
  if (!status_.ok()) return;
  sampled_.resize(rows);
  be_->Sample(logits, rows, vocab, *args, probs_dev_.as<float>(), sampled_dev_.as<int32_t>());
  be_->CopyOut(sampled_.data(), sampled_dev_.get(), rows * sizeof(int32_t));
}

// Rejection sampling of the sampled sequences with drafts, over the distributions Sample left in
// probs_dev_. The draft's distributions q come from the proposals (host); a proposal without them
// (one-hot drafts) among ones with them gets its one-hot rows written out.
void BackendVerifier::LaunchVerify(int32_t vocab, absl::Span<const RowsToVerify> seqs) {
  spec_index_.assign(seqs.size(), -1);
  spec_k_ = 0;
  int32_t n = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (route_[i] != Route::kSampled || seqs[i].draft.tokens.empty()) continue;
    spec_index_[i] = n++;
    spec_k_ = std::max<int32_t>(spec_k_, seqs[i].draft.tokens.size());
  }
  if (n == 0) return;
  const int32_t k = spec_k_;
  num_drafts_.assign(n, 0);
  drafts_.assign(static_cast<size_t>(n) * k, 0);
  target_row_.assign(n, 0);
  accept_draws_.assign(static_cast<size_t>(n) * k, 0.0f);
  final_draws_.assign(n, 0.0f);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t j = spec_index_[i];
    if (j < 0) continue;
    const DraftChain& d = seqs[i].draft;
    const int32_t kj = static_cast<int32_t>(d.tokens.size());
    num_drafts_[j] = kj;
    target_row_[j] = seqs[i].first_row;
    for (int32_t t = 0; t < kj; ++t) {
      drafts_[static_cast<size_t>(j) * k + t] = d.tokens[t];
      accept_draws_[static_cast<size_t>(j) * k + t] = KernelDraw(seqs[i].uniform->Next());
    }
    final_draws_[j] = KernelDraw(seqs[i].uniform->Next());
  }
  const float* q = DraftProbs(vocab, seqs);
  status_.Update(Upload(num_drafts_, &num_drafts_dev_));
  status_.Update(Upload(drafts_, &drafts_dev_));
  status_.Update(Upload(target_row_, &target_row_dev_));
  status_.Update(Upload(draft_row_, &draft_row_dev_));
  status_.Update(Upload(accept_draws_, &accept_dev_));
  status_.Update(Upload(final_draws_, &final_dev_));
  status_.Update(verified_dev_.Grow(be_, static_cast<size_t>(n) * (k + 1) * sizeof(int32_t)));
  status_.Update(num_accepted_dev_.Grow(be_, n * sizeof(int32_t)));
  if (!status_.ok()) return;
  VerifyArgs a;
  a.num_seqs = n;
  a.k = k;
  a.vocab = vocab;
  a.num_drafts = num_drafts_dev_.as<int32_t>();
  a.draft = drafts_dev_.as<int32_t>();
  a.target_probs = probs_dev_.as<float>();
  a.draft_probs = q;
  a.uniform_accept = accept_dev_.as<float>();
  a.uniform_final = final_dev_.as<float>();
  a.target_row = target_row_dev_.as<int32_t>();
  a.draft_row = draft_row_dev_.as<int32_t>();
  a.num_accepted = num_accepted_dev_.as<int32_t>();
  a.tokens = verified_dev_.as<int32_t>();
  be_->VerifyDrafts(a);
  verified_.resize(static_cast<size_t>(n) * (k + 1));
  num_accepted_.resize(n);
  be_->CopyOut(verified_.data(), verified_dev_.get(), verified_.size() * sizeof(int32_t));
  be_->CopyOut(num_accepted_.data(), num_accepted_dev_.get(), n * sizeof(int32_t));
}

// The draft distributions q of the sequences in VerifyDrafts' batch, and draft_row_. Where every
// one with drafts left q in one proposer's buffer (Proposal::backend_probs) of memory this backend
// reads, that buffer is used in place. Otherwise q is gathered on the host and copied in: host
// rows as given, a backend's rows copied out first, one-hot rows for drafts without q. Null: no
// sequence has q (one-hot drafts throughout).
const float* BackendVerifier::DraftProbs(int32_t vocab, absl::Span<const RowsToVerify> seqs) {
  draft_row_.assign(num_drafts_.size(), 0);
  const float* base = nullptr;
  const Backend* owner = nullptr;
  bool in_place = true, any_q = false;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (spec_index_[i] < 0) continue;
    const DraftChain& d = seqs[i].draft;
    any_q = any_q || !d.probs.empty() || d.backend_probs != nullptr;
    const bool here = d.backend_probs != nullptr && d.probs_backend->on_device() == be_->on_device() &&
                      (owner == nullptr || owner == d.probs_backend);
    in_place = in_place && here;
    if (here) {
      owner = d.probs_backend;
      base = base == nullptr ? d.backend_probs : std::min(base, d.backend_probs);
    }
  }
  if (!any_q) return nullptr;
  if (in_place) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (spec_index_[i] >= 0) draft_row_[spec_index_[i]] = static_cast<int32_t>((seqs[i].draft.backend_probs - base) / vocab);
    }
    return base;
  }
  draft_probs_.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t j = spec_index_[i];
    if (j < 0) continue;
    const DraftChain& d = seqs[i].draft;
    const size_t at = draft_probs_.size(), rows = static_cast<size_t>(d.tokens.size()) * vocab;
    draft_row_[j] = static_cast<int32_t>(at / vocab);
    draft_probs_.resize(at + rows, 0.0f);
    if (!d.probs.empty()) {
      std::copy(d.probs.begin(), d.probs.end(), draft_probs_.begin() + at);
    } else if (d.backend_probs != nullptr) {
      d.probs_backend->CopyOut(draft_probs_.data() + at, d.backend_probs, rows * sizeof(float));
      status_.Update(d.probs_backend->Sync());
    } else {
      for (size_t t = 0; t < d.tokens.size(); ++t) draft_probs_[at + t * vocab + d.tokens[t]] = 1.0f;
    }
  }
  status_.Update(Upload(draft_probs_, &draft_probs_dev_));
  return draft_probs_dev_.as<float>();
}

void BackendVerifier::CopyHostRows(const float* logits, int32_t vocab, absl::Span<const RowsToVerify> seqs) {
  host_rows_.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (route_[i] != Route::kHost || !seqs[i].host_rows.empty()) continue;
    const size_t n = (seqs[i].draft.tokens.size() + 1) * static_cast<size_t>(vocab);
    host_rows_[i].resize(n);
    be_->CopyOut(host_rows_[i].data(), logits + static_cast<size_t>(seqs[i].first_row) * vocab, n * sizeof(float));
  }
}

VerifyResult BackendVerifier::Collect(size_t i, const RowsToVerify& s, int32_t vocab, double synthetic_alpha) {
  const absl::Span<const TokenId> drafts = s.draft.tokens;
  const int32_t k = static_cast<int32_t>(drafts.size());
  VerifyResult r;
  switch (route_[i]) {
    case Route::kHost: {
      const absl::Span<const float> rows = s.host_rows.empty() ? absl::MakeConstSpan(host_rows_[i]) : s.host_rows;
      if (k == 0) {
        r.tokens = {s.sampler->Sample(rows, s.history)};
        return r;
      }
      return Verify(rows, vocab, s.draft, *s.params, s.history, *s.uniform, synthetic_alpha);
    }
    case Route::kGreedy:
      if (k == 0) {
        r.tokens = {argmax_[s.first_row]};
        return r;
      }
      return VerifyArgmax(drafts, [&](int32_t row) { return argmax_[s.first_row + row]; }, *s.uniform,
                          synthetic_alpha);
    case Route::kSampled:
      break;
  }
  if (k == 0 || synthetic_alpha >= 0) {
    r.num_accepted = accepted_[i];
    r.tokens.assign(drafts.begin(), drafts.begin() + r.num_accepted);
    r.tokens.push_back(sampled_[s.first_row + r.num_accepted]);
    r.bonus = k > 0 && r.num_accepted == k;
    return r;
  }
  const int32_t j = spec_index_[i];
  r.num_accepted = num_accepted_[j];
  const int32_t* tokens = verified_.data() + static_cast<size_t>(j) * (spec_k_ + 1);
  r.tokens.assign(tokens, tokens + r.num_accepted + 1);
  r.bonus = r.num_accepted == k;
  return r;
}

}  // namespace specula
