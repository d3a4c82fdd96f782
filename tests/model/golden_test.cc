// Golden end-to-end: greedy decoding of the real stories260K model.
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/one_sequence.h"
#include "tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace specula {
namespace {

TEST(GoldenTest, Stories260KGreedyReproducesKnownTextAndNumpyReference) {
  const std::string dir = testing::TinyStoriesDir();
  auto weights = LoadModel(dir + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto tok = LoadTokenizer(dir + "/tok512.bin", (*weights)->config.vocab_size);
  ASSERT_TRUE(tok.ok()) << tok.status();
  LlamaModel model(std::move(weights).value(), MakeCpuBackend());
  const std::vector<TokenId> prompt = (*tok)->Encode("Once upon a time", true);
  GenerateOptions opt;
  opt.max_tokens = 100;
  auto r = Generate(model, prompt, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tokens.size(), 100u);

  // The known text (models/README.md).
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end());
  const std::string text = (*tok)->Decode(all);
  EXPECT_EQ(text.rfind("Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the park. One day, she saw a big, red ball.", 0), 0u)
      << text;

  // All 100 tokens equal an independent numpy implementation's greedy decoding.
  const std::string cmd = absl::StrCat("python3 ", SPECULA_SOURCE_DIR, "/tests/reference/llama_ref.py --model ",
                                       dir, "/stories260K.bin --ids ", absl::StrJoin(prompt, ","), " --greedy 100");
  std::string out;
  ASSERT_EQ(testing::RunCommand(cmd, &out), 0) << cmd;
  std::vector<TokenId> want;
  for (absl::string_view s : absl::StrSplit(absl::StripAsciiWhitespace(out), ',')) {
    int32_t v;
    ASSERT_TRUE(absl::SimpleAtoi(s, &v)) << out;
    want.push_back(v);
  }
  EXPECT_EQ(r->tokens, want);
}

// The draft the repository carries (models/README.md): the target without its third layer and with
// a 256-token context, still telling the story.
TEST(GoldenTest, DraftModelGeneratesStory) {
  const std::string dir = testing::TinyStoriesDir();
  auto weights = LoadModel(dir + "/stories260K-draft.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->config.max_seq_len, 256);
  EXPECT_EQ((*weights)->config.num_layers, 4);
  EXPECT_EQ((*weights)->config.hidden_dim, 172);
  auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
  ASSERT_TRUE(tok.ok());
  LlamaModel model(std::move(weights).value(), MakeCpuBackend());
  GenerateOptions opt;
  opt.max_tokens = 20;
  auto r = Generate(model, (*tok)->Encode("Once upon a time", true), opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*tok)->Decode(r->tokens).rfind(", there a little girl named Lily went to play", 0), 0u)
      << (*tok)->Decode(r->tokens);
}

}  // namespace
}  // namespace specula
