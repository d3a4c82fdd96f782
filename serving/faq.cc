#include "serving/faq.h"

#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;

bool IsPunctuation(UChar32 c) { return (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0; }  // category P*

absl::Status LineError(const std::string& source, size_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--faq: ", source, ":", line, ": ", what));
}

// One line's question and answer, or the error naming what is wrong with it.
absl::Status ParseLine(std::string_view text, const std::string& source, size_t line, std::string* question,
                       std::string* answer) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return LineError(source, line, "not a JSON object; each line is {\"question\": \"...\", \"answer\": \"...\"}");
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "question" && key != "answer") {
      return LineError(source, line, absl::StrCat("unknown field '", key, "'; only question and answer"));
    }
  }
  for (const auto& [name, dst] : {std::pair<const char*, std::string*>{"question", question}, {"answer", answer}}) {
    if (!j.contains(name)) return LineError(source, line, absl::StrCat("no '", name, "'"));
    if (!j[name].is_string() || j[name].get<std::string>().empty()) {
      return LineError(source, line, absl::StrCat("'", name, "' must be a non-empty string"));
    }
    *dst = j[name].get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

std::string NormalizeFaqText(std::string_view text) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfkc_cf = icu::Normalizer2::getNFKCCasefoldInstance(err);
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (U_SUCCESS(err)) {
    icu::UnicodeString folded = nfkc_cf->normalize(u, err);
    if (U_SUCCESS(err)) u = std::move(folded);
  }
  // White space collapsed and trimmed, code point by code point.
  icu::UnicodeString out;
  bool space = false;
  for (int32_t i = 0; i < u.length(); i = u.moveIndex32(i, 1)) {
    const UChar32 c = u.char32At(i);
    if (u_isUWhiteSpace(c)) {
      space = !out.isEmpty();
      continue;
    }
    if (space) out.append(static_cast<UChar>(' '));
    space = false;
    out.append(c);
  }
  // Trailing punctuation, and the space it leaves, repeatedly.
  for (;;) {
    const int32_t n = out.length();
    if (n == 0) break;
    const int32_t last = out.moveIndex32(n, -1);
    const UChar32 c = out.char32At(last);
    if (!IsPunctuation(c) && c != ' ') break;
    out.truncate(last);
  }
  std::string s;
  out.toUTF8String(s);
  return s;
}

absl::StatusOr<FaqTable> FaqTable::Parse(std::string_view text, const std::string& source) {
  FaqTable t;
  std::unordered_map<std::string, size_t> first_line;  // normalized question -> its line
  size_t line = 0;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(start, end - start);
    start = end + 1;
    ++line;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    std::string question, answer;
    if (absl::Status st = ParseLine(l, source, line, &question, &answer); !st.ok()) return st;
    std::string key = NormalizeFaqText(question);
    if (key.empty()) return LineError(source, line, "the question is empty once normalized (only spaces or punctuation)");
    if (auto [it, fresh] = first_line.emplace(key, line); !fresh) {
      return LineError(source, line, absl::StrCat("the question '", question, "' is line ", it->second,
                                                   "'s once normalized ('", key, "')"));
    }
    t.answers_.emplace(std::move(key), std::move(answer));
  }
  if (t.answers_.empty()) return absl::InvalidArgumentError(absl::StrCat("--faq: ", source, ": no question"));
  return t;
}

absl::StatusOr<FaqTable> FaqTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--faq: cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

const std::string* FaqTable::Find(std::string_view question) const {
  auto it = answers_.find(NormalizeFaqText(question));
  return it == answers_.end() ? nullptr : &it->second;
}

}  // namespace specula
