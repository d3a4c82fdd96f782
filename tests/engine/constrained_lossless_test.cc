// Constrained speculative sampling is lossless: under a grammar, the outputs of every way of drafting
// (a draft model sampling under the mask, suffix drafts cut where they leave the grammar, the
// grammar's forced drafts, auto k, verification on the backend's path) follow the target's
// distribution restricted to what the grammar allows at each step, renormalized (chi-square against
// the exact distribution, enumerated prefix by prefix). Drafts whose reported q is not the q they
// were drawn from, and a cut draft's position resampled from the unmasked target, are caught.
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "constrain/constraint.h"
#include "core/categorical.h"
#include "draft/draft_model_proposer.h"
#include "draft/suffix_proposer.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/lossless_util.h"
#include "tests/tiny_pair.h"
#include "verify/rejection_sampler.h"

namespace specula {
namespace {

using testing::ChiSquare;
using testing::ChiSquarePValue;
using testing::Counts;
using testing::Joint;
using testing::Lossless;
using testing::Samples;

// The tiny pair's 12 tokens as bytes: 0-8 "a".."i", 9 "gh" (so that the forced "fghi" splits two
// ways: xgrammar's forced drafts "f" "gh" "i", the target free to take "g" "h"), 10 "j" (never
// allowed), 11 the model's EOS (vocab - 1), the stop token the grammar ends with.
constexpr TokenId kEos = 11;
constexpr const char* kGrammar = R"(root ::= [a-d] [a-d] "fghi" [a-c]?)";
constexpr int kDepth = 8;  // the longest output: 2 letters, f g h i, a letter, EOS
const std::vector<TokenId> kPrompt = {3, 7, 1};

ConstraintVocab TinyVocab() {
  ConstraintVocab v;
  v.token_bytes = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "gh", "j", ""};
  v.kind = VocabKind::kRaw;
  v.stop_ids = {kEos};
  return v;
}

SamplingParams Temperature1() {
  SamplingParams sp;
  sp.temperature = 1.0f;
  return sp;
}

bool Ended(const std::vector<TokenId>& prefix) { return !prefix.empty() && prefix.back() == kEos; }

SchedulerConfig Config(const LlamaModel& m, int32_t k) {
  SchedulerConfig c;
  c.max_num_seqs = 256;
  c.max_num_batched_tokens = 1024;
  c.block_size = 16;
  c.num_blocks = 4096;
  c.max_model_len = m.config().max_seq_len;
  c.num_spec_tokens = k;
  return c;
}

// A draft model's proposer whose drafts and reported q may each leave out the grammar's mask: the
// ways a proposer could get its part in constrained speculation wrong. Drafting follows the grammar
// over the chosen drafts as DraftModelProposer does (so a refused draft ends the chain, and the
// engine cuts it); the q it reports replaces the inner proposer's.
class MaskChoiceProposer final : public Proposer {
 public:
  MaskChoiceProposer(LlamaModel* draft, bool draw_masked, bool report_masked)
      : inner_(draft, 16, 4096), draw_masked_(draw_masked), report_masked_(report_masked) {}

  absl::Status Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) override {
    std::vector<ProposeInput> wrapped(inputs.begin(), inputs.end());
    std::vector<std::unique_ptr<Recorder>> recorders(inputs.size());  // [inputs]: null for unconstrained ones
    for (size_t i = 0; i < wrapped.size(); ++i) {
      if (wrapped[i].grammar == nullptr) continue;
      recorders[i] = std::make_unique<Recorder>(wrapped[i].grammar, *wrapped[i].sampling, draw_masked_, report_masked_);
      wrapped[i].grammar = recorders[i].get();
    }
    if (absl::Status st = inner_.Propose(wrapped, out); !st.ok()) return st;
    for (size_t i = 0; i < recorders.size(); ++i) {
      if (recorders[i] != nullptr) (*out)[i].probs = std::move(recorders[i]->q);
    }
    return absl::OkStatus();
  }
  void Rollback(ProposerState* state, int32_t num_valid) override { inner_.Rollback(state, num_valid); }
  int32_t blocks_in_use() const override { return inner_.blocks_in_use(); }
  int32_t CatchUpTokens(const ProposerState* state, int32_t len) const override {
    return inner_.CatchUpTokens(state, len);
  }

 private:
  // The grammar the inner proposer sees: it masks the draft's row or not, and records the q to
  // report, masked or not (the tests' sampling has no penalties, so no history is needed).
  struct Recorder final : DraftGrammar {
    Recorder(DraftGrammar* real, const SamplingParams& sp, bool draw_masked, bool report_masked)
        : real(real), sp(sp), draw_masked(draw_masked), report_masked(report_masked) {}
    void Mask(absl::Span<float> logits) override {
      std::vector<float> masked(logits.begin(), logits.end()), row;  // [vocab] each
      real->Mask(absl::MakeSpan(masked));
      SamplingProbabilities(sp, report_masked ? absl::MakeConstSpan(masked) : logits, {}, &row);
      q.insert(q.end(), row.begin(), row.end());
      if (draw_masked) std::copy(masked.begin(), masked.end(), logits.begin());
    }
    bool Advance(TokenId token) override { return real->Advance(token); }

    DraftGrammar* real;
    SamplingParams sp;
    bool draw_masked, report_masked;
    std::vector<float> q;  // [drafts, vocab]
  };

  DraftModelProposer inner_;
  const bool draw_masked_, report_masked_;
};

// Prefix -> the model's logits after the prompt and it ([vocab] each).
using Rows = std::map<std::vector<TokenId>, std::vector<float>>;

Rows RowsOf(LlamaModel& model, const std::vector<std::vector<TokenId>>& prefixes) {
  const size_t vocab = model.config().vocab_size;
  const std::vector<float> logits = testing::LastLogits(model, kPrompt, prefixes);  // [prefixes, vocab]
  Rows rows;
  if (logits.empty()) return rows;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    rows[prefixes[i]].assign(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
  }
  return rows;
}

// One speculative step of a constrained sequence, from the engine's pieces on precomputed rows: up to
// k drafts sampled from the draft's unmasked distribution, cut where the grammar refuses one (as an
// n-gram's are), verified one-hot (RejectionSample) against the target's rows, each masked by the
// grammar at its position (ConstrainLogits' order: from the last row back). With
// `unmasked_after_cut`, the row at a cut draft's position is the target's unmasked one: the token
// there may leave the grammar. Appends the step's tokens to `out` up to a stop; false when one
// leaves the grammar. `m` follows `out`.
bool HarnessStep(const Rows& target, const Rows& draft, ConstraintMatcher& m, size_t k, bool unmasked_after_cut,
                 std::mt19937_64& rng, Uniform& uniform, std::vector<TokenId>* out, int64_t* cuts) {
  const SamplingParams sp = Temperature1();
  std::vector<TokenId> drafts, at = *out;
  std::vector<float> q;  // [vocab]
  bool cut = false;
  while (drafts.size() < k && !m.terminated()) {
    SamplingProbabilities(sp, draft.at(at), {}, &q);
    const TokenId d = SampleCategorical(q, std::uniform_real_distribution<double>(0.0, 1.0)(rng));
    if (!m.Accept(d)) {
      cut = true;
      break;
    }
    drafts.push_back(d);
    at.push_back(d);
  }
  *cuts += cut ? 1 : 0;
  const size_t n = drafts.size(), vocab = q.size();
  std::vector<float> probs((n + 1) * vocab), p;  // probs: [n + 1, vocab]; p: [vocab]
  std::vector<uint32_t> mask(MaskWords(static_cast<int32_t>(vocab)));  // [MaskWords(vocab)]
  for (size_t j = n + 1; j-- > 0; at.pop_back()) {
    if (Ended(at)) {
      probs[j * vocab + kEos] = 1.0f;  // a row after a stop: its token is dropped
    } else {
      std::vector<float> row = target.at(at);  // [vocab]
      if (!(unmasked_after_cut && cut && j == n)) {
        m.FillMask(absl::MakeSpan(mask));
        ApplyMask(mask, absl::MakeSpan(row));
      }
      SamplingProbabilities(sp, row, {}, &p);
      std::copy(p.begin(), p.end(), probs.begin() + j * vocab);
    }
    if (j == 0) break;
    m.Rollback(1);
  }
  for (TokenId t : RejectionSample(drafts, probs, {}, static_cast<int32_t>(vocab), uniform).tokens) {
    if (!m.Accept(t)) return false;
    out->push_back(t);
    if (Ended(*out)) break;
  }
  return true;
}

class ConstrainedLosslessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto [td, dd] = testing::WriteTinyPair();
    target_ = testing::Load(td).release();
    draft_ = testing::Load(dd).release();
    compiler_ = ConstraintCompiler::Create(TinyVocab()).release();
    auto compiled = compiler_->Compile(Constraint());
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    compiled_ = new std::shared_ptr<const CompiledConstraint>(*std::move(compiled));
    ConstraintMatcher m(*compiled_, {kEos});
    ASSERT_TRUE(m.Accept(0) && m.Accept(1));
    ASSERT_EQ(m.ForcedTokens(8), (std::vector<TokenId>{5, 9, 8}));  // "f" "gh" "i"
    testing::JointHooks hooks;
    hooks.mask = [](const std::vector<TokenId>& prefix, absl::Span<float> logits) { MaskAt(prefix, logits); };
    hooks.ended = Ended;
    exact_ = new Joint(testing::ExactJoint(*target_, kPrompt, kDepth, Temperature1(), hooks));
    ASSERT_FALSE(exact_->empty());
    for (const auto& [seq, p] : *exact_) ASSERT_TRUE(Ended(seq)) << "an output the grammar leaves unfinished";
  }

  static ConstraintSpec Constraint() { return {ConstraintSpec::Kind::kGrammar, kGrammar, {}, "grammar"}; }

  // Sets the logits the grammar refuses after `prefix` to -inf. logits: [vocab].
  static void MaskAt(const std::vector<TokenId>& prefix, absl::Span<float> logits) {
    ConstraintMatcher m(*compiled_, {kEos});
    for (TokenId t : prefix) ASSERT_TRUE(m.Accept(t));
    std::vector<uint32_t> mask(MaskWords(static_cast<int32_t>(logits.size())));  // [MaskWords(vocab)]
    m.FillMask(absl::MakeSpan(mask));
    ApplyMask(mask, logits);
  }

  // n constrained requests at temperature 1 through `e`; the counts of their whole outputs.
  static Counts SampleOutputs(Engine& e, int64_t n) {
    EXPECT_TRUE(e.Validate().ok()) << e.Validate();
    Counts counts;
    for (int64_t i = 0; i < n;) {
      for (int j = 0; j < 256 && i < n; ++j, ++i) {
        Request r;
        r.id = i;
        r.prompt = kPrompt;
        r.max_tokens = kDepth + 4;  // more than the grammar's longest output: each ends at its EOS
        r.sampling = Temperature1();
        r.sampling.seed = 1000003 * i + 17;
        r.constraint = Constraint();
        r.compiled_constraint = *compiled_;
        const absl::Status st = e.AddRequest(r);
        EXPECT_TRUE(st.ok()) << st;
        if (!st.ok()) return counts;
      }
      while (e.HasUnfinished()) {
        for (auto& d : e.Step()) {
          if (d.finished) counts[d.final.tokens]++;
        }
      }
    }
    EXPECT_EQ(e.scheduler().blocks().num_available(), e.scheduler().blocks().num_blocks());
    return counts;
  }

  static Lossless Test(const Counts& counts, int64_t n, const char* name) {
    const auto [stat, dof] = ChiSquare(*exact_, counts, n);
    const Lossless r{ChiSquarePValue(stat, dof), dof};
    std::printf("[lossless] tiny, grammar, T=1, %s: p = %.4g (dof %d)\n", name, r.p_value, r.dof);
    return r;
  }

  // Samples through an engine of `spec` with k drafts, and tests the outputs against the exact
  // distribution.
  static Lossless Run(SpecConfig spec, int32_t k, const char* name, EngineStats* stats) {
    const int64_t n = Samples();
    Engine e(target_, nullptr, Config(*target_, k), spec);
    const Counts counts = SampleOutputs(e, n);
    *stats = e.stats();
    if (spec.proposer != nullptr) {
      EXPECT_EQ(spec.proposer->blocks_in_use(), 0) << name;
    }
    return Test(counts, n, name);
  }

  static LlamaModel* target_;
  static LlamaModel* draft_;
  static ConstraintCompiler* compiler_;
  static std::shared_ptr<const CompiledConstraint>* compiled_;
  static Joint* exact_;
};
LlamaModel* ConstrainedLosslessTest::target_ = nullptr;
LlamaModel* ConstrainedLosslessTest::draft_ = nullptr;
ConstraintCompiler* ConstrainedLosslessTest::compiler_ = nullptr;
std::shared_ptr<const CompiledConstraint>* ConstrainedLosslessTest::compiled_ = nullptr;
Joint* ConstrainedLosslessTest::exact_ = nullptr;

// A draft model sampling under the mask (its q the masked q), which drafts through the literal
// "fghi" too: with the grammar's forced drafts off, and on (where the draft fills every slot, so
// that none is forced).
TEST_F(ConstrainedLosslessTest, DraftModelFollowsTheConstrainedTarget) {
  for (const auto& [k, grammar_drafts, name] : {std::tuple{2, 0, "draft model, k=2, no forced drafts"},
                                                std::tuple{3, 8, "draft model, k=3, forced drafts on"}}) {
    DraftModelProposer proposer(draft_, 16, 4096);
    SpecConfig spec{&proposer};
    spec.grammar_drafts = grammar_drafts;
    EngineStats s;
    EXPECT_GT(Run(spec, k, name, &s).p_value, 0.001) << name;
    EXPECT_GT(s.spec.accepted_tokens, 0) << name;
    EXPECT_GT(s.constrained_rows, 0) << name;
    EXPECT_LT(s.spec.accepted_tokens, s.spec.draft_tokens) << name;  // rejections too
    EXPECT_EQ(s.spec.forced_tokens, 0) << name;
  }
}

// Suffix drafts (one-hot, from earlier outputs), cut where they leave the grammar; where they have
// none, the grammar's forced drafts.
TEST_F(ConstrainedLosslessTest, SuffixAndForcedDraftsFollowTheConstrainedTarget) {
  SuffixProposer proposer(SuffixParams{}, 4096);
  SpecConfig spec{&proposer};
  spec.grammar_drafts = 8;
  EngineStats s;
  EXPECT_GT(Run(spec, 3, "suffix, k=3, forced drafts", &s).p_value, 0.001);
  EXPECT_GT(s.spec.accepted_tokens, 0);
  EXPECT_GT(s.spec.forced_tokens, 0);
  EXPECT_GT(s.constrained_rows, 0);
  EXPECT_GT(s.spec.draft_tokens, s.spec.forced_tokens);  // the proposer drafted too
}

// No proposer: the grammar's forced continuation ("f" "gh" "i", which the target may split as
// "g" "h") is the only draft, verified one-hot.
TEST_F(ConstrainedLosslessTest, ForcedDraftsAloneFollowTheConstrainedTarget) {
  SpecConfig spec;
  spec.grammar_drafts = 8;
  EngineStats s;
  EXPECT_GT(Run(spec, 0, "forced drafts alone", &s).p_value, 0.001);
  EXPECT_GT(s.spec.accepted_tokens, 0);
  EXPECT_GT(s.spec.forced_tokens, 0);
  EXPECT_EQ(s.spec.forced_tokens, s.spec.draft_tokens);
  EXPECT_LT(s.spec.forced_accepted, s.spec.forced_tokens);  // the target took "g" "h" at times
}

// --num-spec-tokens auto (k from 0 to 4 per sequence and step) with the draft model.
TEST_F(ConstrainedLosslessTest, AutoFollowsTheConstrainedTarget) {
  DraftModelProposer proposer(draft_, 16, 4096);
  EngineStats s;
  EXPECT_GT(Run(testing::AutoSpec(&proposer, *target_, *draft_, 1e-4), 4, "auto (k <= 4)", &s).p_value, 0.001);
  EXPECT_GT(s.spec.accepted_tokens, 0);
  EXPECT_GT(s.constrained_rows, 0);
  testing::ExpectVariedK(s, "auto");
}

// Verification where the logits are (a device's path, here on the CPU backend): a constrained
// sequence's rows are copied to the host, masked and verified there.
TEST_F(ConstrainedLosslessTest, BackendVerificationFollowsTheConstrainedTarget) {
  DraftModelProposer proposer(draft_, 16, 4096);
  SpecConfig spec{&proposer};
  spec.verify_on = SpecConfig::VerifyOn::kBackend;
  EngineStats s;
  EXPECT_GT(Run(spec, 2, "draft model, k=2, verified on the backend's path", &s).p_value, 0.001);
  EXPECT_GT(s.spec.accepted_tokens, 0);
  EXPECT_GT(s.constrained_rows, 0);
}

// Drafts whose reported q is not the distribution they were drawn from. Drawn under the mask with
// the unmasked q reported (q taken before the mask), or drawn without it with the unmasked q
// reported: the verifier's ratios are wrong, and the chi-square rejects the outputs. Drawn without
// the mask with the masked q reported is lossless: a draft the grammar refuses is cut (the target
// then samples that position from its masked row), and one it allows was drawn from the masked q
// given that it is allowed, so each position mixes verification against the masked q with no draft.
TEST_F(ConstrainedLosslessTest, DraftsReportingAnotherQAreCaught) {
  for (const auto& [draw_masked, report_masked, lossless, name] :
       {std::tuple{true, false, false, "drafts drawn under the mask, unmasked q reported"},
        std::tuple{false, false, false, "drafts drawn without the mask, unmasked q reported"},
        std::tuple{false, true, true, "drafts drawn without the mask, masked q reported"}}) {
    MaskChoiceProposer proposer(draft_, draw_masked, report_masked);
    EngineStats s;
    const Lossless r = Run(SpecConfig{&proposer}, 2, name, &s);
    EXPECT_GT(s.spec.accepted_tokens, 0) << name;
    if (lossless) {
      EXPECT_GT(r.p_value, 0.001) << name;
      EXPECT_GT(s.spec.cut_tokens, 0) << name;
    } else {
      EXPECT_LT(r.p_value, 0.001) << name;
    }
  }
}

// The harness (HarnessStep) is sound with every row masked; with the row at a cut draft's position
// left unmasked (a plain resample from the target's p there, which the engine never does) tokens
// outside the grammar appear, and the chi-square rejects the outputs.
TEST_F(ConstrainedLosslessTest, ACutDraftResampledFromTheUnmaskedTargetIsCaught) {
  std::set<std::vector<TokenId>> prefixes;  // every prefix of an output the grammar allows
  for (const auto& [seq, p] : *exact_) {
    for (size_t len = 0; len < seq.size(); ++len) prefixes.emplace(seq.begin(), seq.begin() + len);
  }
  const std::vector<std::vector<TokenId>> list(prefixes.begin(), prefixes.end());
  const Rows target = RowsOf(*target_, list), draft = RowsOf(*draft_, list);
  ASSERT_EQ(target.size(), list.size());
  ASSERT_EQ(draft.size(), list.size());
  const int64_t n = Samples();
  for (const bool broken : {false, true}) {
    std::mt19937_64 rng(7);
    Uniform uniform(11);
    Counts counts;
    int64_t cuts = 0, invalid = 0;
    for (int64_t i = 0; i < n; ++i) {
      ConstraintMatcher m(*compiled_, {kEos});
      std::vector<TokenId> out;
      bool valid = true;
      while (valid && !Ended(out)) valid = HarnessStep(target, draft, m, 3, broken, rng, uniform, &out, &cuts);
      invalid += valid ? 0 : 1;
      counts[valid ? out : std::vector<TokenId>{-1}]++;
    }
    const Lossless r = Test(counts, n, broken ? "harness, a cut draft's position unmasked" : "harness, every row masked");
    EXPECT_GT(cuts, n / 10);
    if (broken) {
      EXPECT_GT(invalid, 0);
      EXPECT_LT(r.p_value, 0.001);
    } else {
      EXPECT_EQ(invalid, 0);
      EXPECT_GT(r.p_value, 0.001);
    }
  }
}

}  // namespace
}  // namespace specula
