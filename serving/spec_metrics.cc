#include "serving/spec_metrics.h"

#include <algorithm>

#include "nlohmann/json.hpp"

namespace specula {
namespace {

std::vector<int64_t> Padded(const std::vector<int64_t>& v, size_t size) {
  std::vector<int64_t> out = v;
  if (out.size() < size) out.resize(size, 0);
  return out;
}

}  // namespace

SpecDecodingMetrics SpecDecodingMetricsOf(const SpecStats& s, int32_t num_spec_tokens) {
  SpecDecodingMetrics m;
  m.num_spec_tokens = num_spec_tokens;
  m.num_spec_steps = s.drafts;
  m.num_draft_tokens = s.draft_tokens;
  m.num_accepted_draft_tokens = s.accepted_tokens;
  m.mean_acceptance_length = s.drafts > 0 ? s.mean_acceptance_length() : 1.0;
  m.draft_acceptance_rate = s.acceptance_rate();
  // A draft longer than k cannot happen; were it to, its buckets are kept, not cut.
  const size_t k = std::max<size_t>({static_cast<size_t>(std::max(num_spec_tokens, 0)), s.accepted_per_position.size(),
                                     s.reached_per_position.size(),
                                     s.acceptance_histogram.empty() ? 0 : s.acceptance_histogram.size() - 1});
  m.acceptance_histogram = Padded(s.acceptance_histogram, k + 1);
  m.accepted_per_position = Padded(s.accepted_per_position, k);
  m.reached_per_position = Padded(s.reached_per_position, k);
  m.num_forced_draft_tokens = s.forced_tokens;
  m.num_accepted_forced_tokens = s.forced_accepted;
  m.num_grammar_cut_tokens = s.cut_tokens;
  return m;
}

bool ShowsSpecDecoding(const SpecStats& s, int32_t num_spec_tokens) {
  return num_spec_tokens > 0 || (num_spec_tokens == 0 && s.drafts > 0);
}

nlohmann::json SpecDecodingJson(const SpecStats& s, int32_t num_spec_tokens) {
  const SpecDecodingMetrics m = SpecDecodingMetricsOf(s, num_spec_tokens);
  nlohmann::json j = nlohmann::json::object();
  j["mean_acceptance_length"] = m.mean_acceptance_length;
  j["draft_acceptance_rate"] = m.draft_acceptance_rate;
  j["acceptance_histogram"] = m.acceptance_histogram;
  j["num_spec_steps"] = m.num_spec_steps;
  j["num_accepted_draft_tokens"] = m.num_accepted_draft_tokens;
  j["num_draft_tokens"] = m.num_draft_tokens;
  j["num_spec_tokens"] = m.num_spec_tokens;
  j["accepted_per_position"] = m.accepted_per_position;
  j["reached_per_position"] = m.reached_per_position;
  j["num_forced_draft_tokens"] = m.num_forced_draft_tokens;
  j["num_accepted_forced_tokens"] = m.num_accepted_forced_tokens;
  j["num_grammar_cut_tokens"] = m.num_grammar_cut_tokens;
  return j;
}

}  // namespace specula
