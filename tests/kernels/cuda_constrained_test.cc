// Structured output on the GPU (label `gpu`, skipped without one): a constrained sequence's rows are
// copied to the host, masked and verified there while the others are chosen on the device, and a
// draft model on the device chooses a constrained row's draft on the host. Greedy constrained output
// on the GPU (plain, forced drafts, a draft model, n-gram) equals the CPU engine's plain
// constrained output in f32, and every output follows its constraint.
#include <map>
#include <regex>

#include "draft/draft_model_proposer.h"
#include "draft/ngram_proposer.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "tests/kernels/gpu_util.h"
#include "tests/test_util.h"

namespace specula {
namespace {

using Kind = ConstraintSpec::Kind;

constexpr const char* kSchema = R"({"type": "object", "properties": {
  "mood": {"enum": ["happy", "sad"]}, "age": {"type": "integer", "minimum": 1, "maximum": 99}},
  "required": ["mood", "age"]})";
constexpr const char* kPhone = "[0-9]{3}-[0-9]{4}";

std::unique_ptr<LlamaModel> Load(const std::string& path, const std::string& device) {
  auto w = LoadModel(path);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  auto be = MakeBackend({device, device == "cuda" ? "f32" : ""});
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return nullptr;
  auto m = LlamaModel::Create(std::move(w).value(), std::move(be).value());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Greedy requests: schemas, regexes and plain ones in turn.
std::vector<Request> Requests(const Tokenizer& tok, int n) {
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    r.prompt = tok.Encode(i % 2 == 0 ? "Lily went to the park and" : "Tom saw a big dog", true);
    r.max_tokens = 96;
    if (i % 3 == 0) r.constraint = {Kind::kJsonSchema, kSchema, {}, "json_schema"};
    if (i % 3 == 1) r.constraint = {Kind::kRegex, kPhone, {}, "regex"};
    if (i % 3 == 2) r.ignore_eos = true, r.max_tokens = 20;
    out.push_back(std::move(r));
  }
  return out;
}

std::map<RequestId, RequestOutput> RunEngine(LlamaModel& m, const Tokenizer& tok, const std::vector<Request>& reqs,
                                       Proposer* proposer, int32_t k, int32_t grammar_drafts) {
  SchedulerConfig c;
  c.max_num_seqs = 32;
  c.max_num_batched_tokens = 1024;
  c.num_blocks = 512;
  c.max_model_len = m.config().max_seq_len;
  c.num_spec_tokens = k;
  SpecConfig spec{proposer};
  spec.grammar_drafts = grammar_drafts;
  Engine e(&m, &tok, c, spec);
  EXPECT_TRUE(e.Validate().ok()) << e.Validate();
  for (const Request& r : reqs) EXPECT_TRUE(e.AddRequest(r).ok()) << r.id;
  std::map<RequestId, RequestOutput> out;
  while (e.HasUnfinished()) {
    for (auto& d : e.Step()) {
      if (d.finished) out.emplace(d.id, std::move(d.final));
    }
  }
  return out;
}

TEST(CudaConstrainedTest, ConstrainedSpeculationOnTheDeviceEqualsTheCpu) {
  SPECULA_REQUIRE_GPU();
  const std::string dir = testing::TinyStoriesDir();
  auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto cpu = Load(dir + "/stories260K.bin", "cpu");
  auto gpu = Load(dir + "/stories260K.bin", "cuda"), draft = Load(dir + "/stories260K-draft.bin", "cuda");
  ASSERT_TRUE(cpu && gpu && draft);
  const std::vector<Request> reqs = Requests(**tok, 24);
  const auto want = RunEngine(*cpu, **tok, reqs, nullptr, 0, 0);
  DraftModelProposer proposer(draft.get(), 16, 512);
  NgramProposer ngram(1, 3);
  struct Case {
    const char* name;
    Proposer* proposer;
    int32_t k, grammar_drafts;
  };
  for (const Case& c : {Case{"plain", nullptr, 0, 0}, Case{"forced drafts", nullptr, 0, 8},
                        Case{"draft model and forced drafts", &proposer, 3, 8}, Case{"n-gram", &ngram, 3, 0}}) {
    const auto got = RunEngine(*gpu, **tok, reqs, c.proposer, c.k, c.grammar_drafts);
    int same = 0;
    for (const Request& r : reqs) {
      const RequestOutput& o = got.at(r.id);
      same += o.tokens == want.at(r.id).tokens;
      EXPECT_EQ(o.tokens, want.at(r.id).tokens) << c.name << ", request " << r.id;
      if (r.constraint.kind == Kind::kRegex) {
        EXPECT_TRUE(std::regex_match(o.text, std::regex(kPhone))) << o.text;
      } else if (r.constraint.kind == Kind::kJsonSchema) {
        EXPECT_TRUE(nlohmann::json::parse(o.text, nullptr, false).is_object()) << o.text;
      }
    }
    std::printf("[gpu] constrained, %s: %d of %zu requests identical to the CPU's plain constrained greedy\n", c.name,
                same, reqs.size());
  }
  EXPECT_EQ(proposer.blocks_in_use(), 0);
}

}  // namespace
}  // namespace specula
