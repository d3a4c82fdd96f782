#include "serving/faq.h"

#include <gtest/gtest.h>

namespace specula {
namespace {

TEST(NormalizeFaqText, FoldsCaseWidthSpaceAndTrailingPunctuation) {
  EXPECT_EQ(NormalizeFaqText("How do I reset my password?"), "how do i reset my password");
  EXPECT_EQ(NormalizeFaqText("  HOW   do\tI\nreset my password ?! "), "how do i reset my password");
  // Full-width letters and question mark (NFKC), a ligature, German sharp s (case folding).
  EXPECT_EQ(NormalizeFaqText("ＨＯＷ do I reset my ｐａｓｓｗｏｒｄ？"), "how do i reset my password");
  EXPECT_EQ(NormalizeFaqText("ﬁle a claim"), "file a claim");
  EXPECT_EQ(NormalizeFaqText("STRASSE"), NormalizeFaqText("straße"));
  // Unicode spaces (no-break, ideographic) and Spanish punctuation at the end only.
  EXPECT_EQ(NormalizeFaqText("¿dónde\u00a0está\u3000mi pedido?"), "¿dónde está mi pedido");
  // Punctuation inside stays: it can change the question.
  EXPECT_EQ(NormalizeFaqText("what's the U.S. price..."), "what's the u.s. price");
  EXPECT_EQ(NormalizeFaqText(" ?! "), "");
  EXPECT_EQ(NormalizeFaqText(""), "");
}

TEST(NormalizeFaqText, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(NormalizeFaqText("a\xff" "b"), "a\xEF\xBF\xBD" "b");
}

TEST(FaqTable, FindsTheAnswerOfAMatchingQuestion) {
  auto t = FaqTable::Parse(
      "{\"question\": \"How do I reset my password?\", \"answer\": \"Use the link on the sign-in page.\"}\n"
      "\n"
      "{\"question\": \"Opening hours\", \"answer\": \"9 to 5, Monday to Friday.\"}\r\n",
      "faq.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);
  ASSERT_NE(t->Find("how do i RESET my password"), nullptr);
  EXPECT_EQ(*t->Find("how do i RESET my password"), "Use the link on the sign-in page.");
  EXPECT_EQ(*t->Find("OPENING HOURS?"), "9 to 5, Monday to Friday.");
  EXPECT_EQ(t->Find("How do I reset my passwords?"), nullptr);  // exact match only
  EXPECT_EQ(t->Find(""), nullptr);
}

TEST(FaqTable, ErrorsNameTheFileAndLine) {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"{\"question\": \"a\", \"answer\": \"b\"}\nnot json\n", "--faq: f.jsonl:2: not a JSON object"},
      {"[1, 2]\n", "--faq: f.jsonl:1: not a JSON object"},
      {"{\"question\": \"a\"}\n", "--faq: f.jsonl:1: no 'answer'"},
      {"{\"answer\": \"a\"}\n", "--faq: f.jsonl:1: no 'question'"},
      {"{\"question\": 3, \"answer\": \"a\"}\n", "--faq: f.jsonl:1: 'question' must be a non-empty string"},
      {"{\"question\": \"q\", \"answer\": \"\"}\n", "--faq: f.jsonl:1: 'answer' must be a non-empty string"},
      {"{\"question\": \"q\", \"answer\": \"a\", \"tags\": []}\n", "--faq: f.jsonl:1: unknown field 'tags'"},
      {"{\"question\": \"?!\", \"answer\": \"a\"}\n", "--faq: f.jsonl:1: the question is empty once normalized"},
      {"{\"question\": \"Hours?\", \"answer\": \"a\"}\n\n{\"question\": \"hours\", \"answer\": \"b\"}\n",
       "--faq: f.jsonl:3: the question 'hours' is line 1's once normalized"},
      {"\n\n", "--faq: f.jsonl: no question"},
  };
  for (const Case& c : cases) {
    auto t = FaqTable::Parse(c.text, "f.jsonl");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(t.status().message().find(c.error), std::string::npos) << t.status() << " lacks " << c.error;
  }
}

TEST(FaqTable, AMissingFileIsNamed) {
  auto t = FaqTable::Load("/nonexistent/faq.jsonl");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--faq: cannot open /nonexistent/faq.jsonl"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace specula
