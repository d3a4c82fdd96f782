// The FAQ answers of the degrade path (`specula serve --degrade faq --faq FILE`): a request that
// admission control would refuse is answered from this table when its question matches one exactly
// after normalization, at once and without the engine. No engine, no wire types; ICU stays in
// faq.cc.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"

namespace specula {

// What a question is matched as, in this order:
// 1. Unicode NFKC with case folding (ICU's nfkc_cf: compatibility forms such as full-width letters
//    and ligatures become their plain letters, case folded, default-ignorable characters removed);
// 2. every run of Unicode white space becomes one space, and leading and trailing space goes;
// 3. trailing punctuation (Unicode general category P*, e.g. ? ! . ？ ¿) and the space before it goes,
//    repeatedly.
// So "  How do I RESET my password?? " and "how do i reset my password" match. Invalid UTF-8 bytes
// become U+FFFD first.
std::string NormalizeFaqText(std::string_view text);

class FaqTable {
 public:
  // A JSONL file: one object a line, {"question": "...", "answer": "..."}, both non-empty strings;
  // blank lines are skipped. Errors name the file and line: a line that is not JSON, a missing or
  // non-string field, a field of another name, a question that normalizes to nothing, and the same
  // normalized question given twice (with both lines). An empty table is an error too.
  static absl::StatusOr<FaqTable> Load(const std::string& path);
  // The same from text, `source` naming it in errors.
  static absl::StatusOr<FaqTable> Parse(std::string_view text, const std::string& source);

  // The answer to a question (raw text: it is normalized here), or null.
  const std::string* Find(std::string_view question) const;
  size_t size() const { return answers_.size(); }

 private:
  std::unordered_map<std::string, std::string> answers_;  // normalized question -> answer
};

}  // namespace specula
