// CheckConstraint: the size of every kind, then each kind's own checks: a JSON schema through the
// walk of constrain/json_schema_walk.h, a regex and a grammar through the scans of
// constrain/pattern_check.h, a structural tag's formats through either, a choice list's bounds.
#include "constrain/schema_check.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "constrain/json_schema_walk.h"
#include "constrain/pattern_check.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using Json = nlohmann::json;
using Problem = std::optional<std::string>;  // what is wrong, without the field's name
using constrain::PointerChild;

// absl's string_view is its own type in this Abseil build: std::string_view goes into StrCat through it.
absl::string_view V(std::string_view s) { return {s.data(), s.size()}; }

const Json* Member(const Json& object, std::string_view key) {
  const auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

// JSON nesting is bounded before the text is parsed, so that nothing deeper reaches nlohmann's
// parser or the walks: a schema's nesting costs about two JSON levels, and literals have room too.
int64_t MaxJsonNesting(const ConstraintLimits& limits) { return 4 * static_cast<int64_t>(limits.max_depth) + 4; }

Problem JsonNesting(std::string_view text, const ConstraintLimits& limits) {
  int64_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > MaxJsonNesting(limits)) {
        return absl::StrCat("the JSON at byte ", i, " is nested deeper than the limit of ", MaxJsonNesting(limits),
                            " levels");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

// Where nlohmann's parser stops on a syntax error, and its message (without the exception's id).
class SyntaxError : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    const std::string_view what = e.what();
    const size_t id_end = what.find("] ");
    // nlohmann counts the bytes read, the one at fault (or the end) included.
    message_ = absl::StrCat("not valid JSON at byte ", position > 0 ? position - 1 : 0, ": ",
                            V(id_end == std::string_view::npos ? what : what.substr(id_end + 2)));
    return false;
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_ = "not valid JSON";
};

Problem ParseJson(std::string_view text, const ConstraintLimits& limits, Json* out) {
  if (Problem p = JsonNesting(text, limits)) return p;
  *out = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!out->is_discarded()) return std::nullopt;
  SyntaxError error;
  Json::sax_parse(text.begin(), text.end(), &error);
  return error.message();
}

// One format of a structural tag: a json_schema's schema through the schema walk, a regex's pattern
// and a grammar's text through the scans, a repeat's counts within max_repeat.
Problem FormatProblem(const Json& format, std::string_view type, const std::string& path,
                      const ConstraintLimits& limits) {
  auto at = [&](std::string_view member) { return PointerChild(path, member); };
  if (type == "json_schema" || type == "qwen_xml_parameter") {
    const Json* schema = Member(format, "json_schema");
    if (schema != nullptr && (schema->is_object() || schema->is_boolean())) {
      return constrain::JsonSchemaProblem(*schema, limits, at("json_schema"));
    }
  } else if (type == "regex") {
    const Json* pattern = Member(format, "pattern");
    if (pattern == nullptr || !pattern->is_string()) return std::nullopt;
    if (Problem p = constrain::RegexProblem(pattern->get_ref<const std::string&>(), limits)) {
      return absl::StrCat("the regex at ", at("pattern"), ": ", *p);
    }
  } else if (type == "grammar") {
    if (const Json* syntax = Member(format, "syntax"); syntax != nullptr && *syntax != "ebnf") {
      return absl::StrCat("grammar syntax ", syntax->dump(), " at ", at("syntax"), " is not supported (only ebnf)");
    }
    const Json* grammar = Member(format, "grammar");
    if (grammar == nullptr || !grammar->is_string()) return std::nullopt;
    if (Problem p = constrain::GrammarProblem(grammar->get_ref<const std::string&>(), limits)) {
      return absl::StrCat("the grammar at ", at("grammar"), ": ", *p);
    }
  } else if (type == "repeat") {
    for (const char* key : {"min", "max"}) {
      const Json* count = Member(format, key);
      if (count != nullptr && count->is_number() && count->get<double>() > limits.max_repeat) {
        return absl::StrCat("'", key, "' ", count->dump(), " at ", at(key), " is more than the limit of ",
                            limits.max_repeat);
      }
    }
  }
  return std::nullopt;
}

// A structural tag, walked without recursion: every object with a string "type" is a format, and
// formats nest at most max_depth deep.
Problem StructuralTagProblem(const Json& root, const ConstraintLimits& limits) {
  struct Item {
    const Json* value;
    std::string path;
    int32_t formats;  // formats around it
  };
  std::vector<Item> stack = {{&root, "", 0}};  // [values still to look at]
  while (!stack.empty()) {
    const Item item = std::move(stack.back());
    stack.pop_back();
    const Json& v = *item.value;
    int32_t formats = item.formats;
    const Json* type = v.is_object() ? Member(v, "type") : nullptr;
    const bool is_format = type != nullptr && type->is_string();
    if (is_format && ++formats > limits.max_depth) {
      return absl::StrCat("the format at ", item.path.empty() ? "/" : item.path, " is nested deeper than the limit of ",
                          limits.max_depth);
    }
    if (is_format) {
      if (Problem p = FormatProblem(v, type->get_ref<const std::string&>(), item.path, limits)) return p;
    }
    if (v.is_object()) {
      for (const auto& [key, child] : v.items()) {
        if (!(is_format && key == "json_schema")) stack.push_back({&child, PointerChild(item.path, key), formats});
      }
    } else if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) {
        stack.push_back({&v[i], PointerChild(item.path, std::to_string(i)), formats});
      }
    }
  }
  return std::nullopt;
}

Problem ChoiceProblem(const std::vector<std::string>& choices, const ConstraintLimits& limits) {
  if (choices.empty()) return std::string("the choice list is empty");
  if (static_cast<int64_t>(choices.size()) > limits.max_enum) {
    return absl::StrCat("the choice list has ", choices.size(), " choices, more than the limit of ", limits.max_enum);
  }
  int64_t bytes = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) return absl::StrCat("choice ", i, " is empty");
    bytes += static_cast<int64_t>(choices[i].size());
  }
  if (bytes > limits.max_text_bytes) {
    return absl::StrCat("the choices are ", bytes, " bytes in all, more than the limit of ", limits.max_text_bytes);
  }
  return std::nullopt;
}

Problem ConstraintProblem(const ConstraintSpec& spec, const ConstraintLimits& limits) {
  using Kind = ConstraintSpec::Kind;
  if (static_cast<int64_t>(spec.text.size()) > limits.max_text_bytes) {
    return absl::StrCat("the ", ConstraintKindName(spec.kind), " is ", spec.text.size(),
                        " bytes, more than the limit of ", limits.max_text_bytes);
  }
  Json json;
  switch (spec.kind) {
    case Kind::kNone:
    case Kind::kJsonObject:
      return std::nullopt;
    case Kind::kRegex:
      return constrain::RegexProblem(spec.text, limits);
    case Kind::kGrammar:
      return constrain::GrammarProblem(spec.text, limits);
    case Kind::kChoice:
      return ChoiceProblem(spec.choices, limits);
    case Kind::kJsonSchema:
      if (Problem p = ParseJson(spec.text, limits, &json)) return p;
      // xgrammar refuses `false` (nothing satisfies it) and anything but an object or a boolean.
      if (!json.is_object() && !(json.is_boolean() && json.get<bool>())) {
        return std::string("the schema is not a JSON object or true");
      }
      return constrain::JsonSchemaProblem(json, limits, "");
    case Kind::kStructuralTag:
      if (Problem p = ParseJson(spec.text, limits, &json)) return p;
      if (!json.is_object()) return std::string("the structural tag is not a JSON object");
      return StructuralTagProblem(json, limits);
  }
  return std::nullopt;
}

}  // namespace

absl::Status CheckConstraint(const ConstraintSpec& spec, const ConstraintLimits& limits) {
  const Problem problem = ConstraintProblem(spec, limits);
  if (!problem) return absl::OkStatus();
  const std::string field = spec.field.empty() ? ConstraintKindName(spec.kind) : spec.field;
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", *problem));
}

}  // namespace specula
