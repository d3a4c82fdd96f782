// The JSON Schema part of constrain/schema_check.h: an allow-list of the keywords that xgrammar
// 0.2.9's converter (cpp/json_schema_converter.cc, SchemaParser) implements. Its Parse takes the
// first of $ref, const, enum, anyOf, oneOf, allOf and type that a schema object has and ignores
// every other keyword beside it; within a type it reads only that type's keywords. So each schema
// object is checked the same way: what decides it, then what may stand beside that.
#include "constrain/json_schema_walk.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "constrain/pattern_check.h"
#include "nlohmann/json.hpp"

namespace specula::constrain {
namespace {

using Json = nlohmann::json;
using Problem = std::optional<std::string>;
using Keywords = std::span<const std::string_view>;

// Annotations: xgrammar skips them (IsSchemaAnnotationKey); they change no output.
constexpr std::string_view kAnnotations[] = {"title",    "description", "default",  "examples", "$schema",
                                             "$comment", "deprecated",  "readOnly", "writeOnly"};
// Schemas that only a $ref reaches: walked as schemas, generating nothing where they stand.
constexpr std::string_view kDefinitions[] = {"$defs", "definitions"};
// What decides a schema object, in the order of xgrammar's Parse; oneOf is refused (it falls back
// to anyOf with a warning unless the branches are provably disjoint), allOf takes one branch only.
constexpr std::string_view kDeciders[] = {"$ref", "const", "enum", "anyOf", "allOf", "type", "$id"};
// integer (ParseInteger): bounds as a range; multipleOf as a modulo automaton only without bounds
// (with bounds xgrammar drops it or enumerates the range).
constexpr std::string_view kIntegerKeywords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                                 "multipleOf"};
// number (ParseNumber): the bounds; multipleOf is ignored with a warning, so it is refused.
constexpr std::string_view kNumberKeywords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
// string (GenerateString): a built-in format, else a pattern, else the lengths; one of the three, as
// a format drops the pattern and either drops the lengths.
constexpr std::string_view kStringKeywords[] = {"pattern", "format", "minLength", "maxLength"};
// array (ParseArray): uniqueItems, contains, minContains and maxContains are ignored (refused).
constexpr std::string_view kArrayKeywords[] = {"items", "prefixItems", "unevaluatedItems", "minItems", "maxItems"};
// object (ParseObject): dependentRequired, dependentSchemas and dependencies are ignored (refused).
constexpr std::string_view kObjectKeywords[] = {
    "properties",        "required",      "additionalProperties", "unevaluatedProperties",
    "patternProperties", "propertyNames", "minProperties",        "maxProperties"};
// The formats xgrammar has a regex for (JSONFormatToRegexPattern); it ignores any other.
constexpr std::string_view kFormats[] = {
    "email",    "date", "time", "date-time",     "duration",     "ipv4",         "ipv6",
    "hostname", "uuid", "uri",  "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"};
// The JSON Schema types (IsSupportedJSONType).
constexpr std::string_view kTypes[] = {"null", "boolean", "object", "array", "number", "string", "integer"};

// absl's string_view is its own type in this Abseil build: std::string_view goes into StrCat through it.
absl::string_view V(std::string_view s) { return {s.data(), s.size()}; }

bool In(Keywords set, std::string_view key) { return std::find(set.begin(), set.end(), key) != set.end(); }

bool Known(std::string_view key) {
  for (Keywords set : std::initializer_list<Keywords>{kAnnotations, kDefinitions, kDeciders, kIntegerKeywords,
                                                      kStringKeywords, kArrayKeywords, kObjectKeywords}) {
    if (In(set, key)) return true;
  }
  return false;
}

// Keywords that may stand beside any decider.
bool Neutral(std::string_view key) { return In(kAnnotations, key) || In(kDefinitions, key) || key == "$id"; }

Keywords KeywordsOf(std::string_view type) {
  if (type == "integer") return kIntegerKeywords;
  if (type == "number") return kNumberKeywords;
  if (type == "string") return kStringKeywords;
  if (type == "array") return kArrayKeywords;
  if (type == "object") return kObjectKeywords;
  return {};
}

// One JSON pointer token (RFC 6901).
std::string PointerToken(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else
      out += c;
  }
  return out;
}

// A count keyword's value: a non-negative JSON integer (xgrammar reads these as int64 only).
std::optional<int64_t> Count(const Json& v) {
  if (v.is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return std::nullopt;
}

bool IsWhole(const Json& v) {
  return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
}

bool OfType(const Json& v, std::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "number") return v.is_number();
  if (type == "string") return v.is_string();
  return IsWhole(v);  // integer
}

// Decodes a "#/..." $ref as xgrammar does (percent-decoding, then '/' and the "~1", "~0" escapes)
// into the pointer the walk writes for the schema it names.
std::string CanonicalPointer(std::string_view fragment) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string decoded;
  for (size_t i = 0; i < fragment.size(); ++i) {
    if (fragment[i] == '%' && i + 2 < fragment.size() && hex(fragment[i + 1]) >= 0 && hex(fragment[i + 2]) >= 0) {
      decoded += static_cast<char>(hex(fragment[i + 1]) * 16 + hex(fragment[i + 2]));
      i += 2;
    } else {
      decoded += fragment[i];
    }
  }
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t slash = decoded.find('/', start);
    std::string token = decoded.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    std::string plain;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        plain += token[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        plain += token[i];
      }
    }
    absl::StrAppend(&out, "/", PointerToken(plain));
    if (slash == std::string::npos) return out;
    start = slash + 1;
  }
}

}  // namespace

std::string PointerChild(std::string_view path, std::string_view token) {
  return absl::StrCat(V(path), "/", PointerToken(token));
}

namespace {

const Json* Member(const Json& object, std::string_view key) {
  const auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

// xgrammar's modulo automaton for an unbounded integer's multipleOf has one state per residue, and
// it refuses more than 1024 (kIntegerMultipleOfMax).
constexpr double kMaxMultipleOf = 1024;
// Integer bounds stay where a double holds every whole number, so the range check below is exact.
constexpr double kMaxIntegerBound = 9007199254740992.0;  // 2^53

// The walk of one JSON schema document, without recursion: a stack of the schemas still to check,
// each with its pointer and nesting, so that a document nested past max_depth is refused there.
class SchemaWalk {
 public:
  // `prefix`: where the document stands in the constraint (a structural tag's member), put before
  // every pointer in a message.
  SchemaWalk(const ConstraintLimits& limits, std::string prefix) : limits_(limits), prefix_(std::move(prefix)) {}

  Problem Run(const Json& root) {
    stack_.push_back({&root, "", 1, false});
    while (!stack_.empty()) {
      const Item item = std::move(stack_.back());
      stack_.pop_back();
      if (Problem p = Visit(item)) return p;
    }
    return CheckRefs();
  }

 private:
  struct Item {
    const Json* schema;
    std::string path;     // its JSON pointer in the document
    int32_t depth;        // 1 at the root
    bool implied_string;  // propertyNames: xgrammar reads it as a string schema when it has no type
  };
  struct Ref {
    std::string from;    // the pointer of the schema that holds it
    std::string target;  // the pointer it names, as the walk writes pointers
    std::string uri;
  };

  std::string At(std::string_view path) const {
    std::string at = absl::StrCat(prefix_, V(path));
    return at.empty() ? "/" : at;
  }

  void Push(const Json& schema, const Item& parent, std::string path, bool implied_string = false) {
    stack_.push_back({&schema, std::move(path), parent.depth + 1, implied_string});
  }

  Problem Visit(const Item& item) {
    const Json& s = *item.schema;
    const std::string at = At(item.path);
    if (item.depth > limits_.max_depth) {
      return absl::StrCat("the schema at ", at, " is nested deeper than the limit of ", limits_.max_depth);
    }
    if (s.is_boolean() && !s.get<bool>()) return absl::StrCat("the schema 'false' at ", at, " accepts nothing");
    if (!s.is_boolean() && !s.is_object()) return absl::StrCat("the schema at ", at, " is not an object or a boolean");
    if (!item.implied_string) schemas_.insert(item.path);
    if (s.is_boolean()) return std::nullopt;
    for (const auto& [key, value] : s.items()) {
      if (!Known(key)) return absl::StrCat("'", key, "' at ", at, " is not supported");
    }
    if (const Json* id = Member(s, "$id"); id != nullptr && (!item.path.empty() || !id->is_string())) {
      return absl::StrCat("'$id' at ", at, " is not supported: only a string at the root, where '#' resolves");
    }
    for (std::string_view keyword : kDefinitions) {
      const Json* defs = Member(s, keyword);
      if (defs == nullptr) continue;
      if (!defs->is_object()) return absl::StrCat("'", V(keyword), "' at ", at, " is not an object");
      for (const auto& [name, schema] : defs->items()) {
        Push(schema, item, PointerChild(PointerChild(item.path, keyword), name));
      }
    }
    if (s.contains("$ref")) return Reference(s, item);
    if (s.contains("const")) return Literal(s, item, "const");
    if (s.contains("enum")) return Literal(s, item, "enum");
    if (s.contains("anyOf") || s.contains("allOf")) return Combinator(s, item);
    return Typed(s, item);
  }

  // xgrammar reads only `decider` (and the annotations) of a schema object it decides.
  Problem Beside(const Json& s, const Item& item, std::string_view decider, std::string_view also = {}) const {
    for (const auto& [key, value] : s.items()) {
      if (key == decider || Neutral(key) || (!also.empty() && key == also)) continue;
      return absl::StrCat("'", key, "' beside '", V(decider), "' at ", At(item.path), " is not supported");
    }
    return std::nullopt;
  }

  Problem Reference(const Json& s, const Item& item) {
    const std::string at = At(item.path);
    if (Problem p = Beside(s, item, "$ref")) return p;
    const Json& ref = s.at("$ref");
    if (!ref.is_string()) return absl::StrCat("'$ref' at ", at, " is not a string");
    const std::string& uri = ref.get_ref<const std::string&>();
    std::string target;
    if (uri.starts_with("#/")) {
      target = CanonicalPointer(std::string_view(uri).substr(2));
    } else if (uri != "#") {
      return absl::StrCat("'$ref' '", uri, "' at ", at, " is not supported: only '#' and '#/...' within the document");
    }
    pure_refs_[item.path] = target;
    refs_.push_back({item.path, std::move(target), uri});
    return std::nullopt;
  }

  // The schema's `type`: none, one JSON Schema type, or a list of distinct ones.
  Problem Types(const Json& s, const std::string& at, std::vector<std::string>* types) const {
    const Json* type = Member(s, "type");
    if (type == nullptr) return std::nullopt;
    const bool list = type->is_array() && !type->empty();
    if (!type->is_string() && !list) {
      return absl::StrCat("'type' at ", at, " is not a type or a non-empty list of types");
    }
    std::vector<const Json*> listed;
    if (list) {
      for (const Json& t : *type) listed.push_back(&t);
    } else {
      listed.push_back(type);
    }
    for (const Json* entry : listed) {
      const Json& t = *entry;
      if (!t.is_string() || !In(kTypes, t.get_ref<const std::string&>())) {
        return absl::StrCat("'type' ", t.is_string() ? t.get<std::string>() : t.dump(), " at ", at,
                            " is not a JSON Schema type");
      }
      if (std::find(types->begin(), types->end(), t.get<std::string>()) != types->end()) {
        return absl::StrCat("'type' at ", at, " lists '", t.get<std::string>(), "' twice");
      }
      types->push_back(t.get<std::string>());
    }
    return std::nullopt;
  }

  // const and enum: literal values, each of the schema's type where it gives one.
  Problem Literal(const Json& s, const Item& item, std::string_view keyword) const {
    const std::string at = At(item.path);
    if (Problem p = Beside(s, item, keyword, "type")) return p;
    const Json& v = s.at(std::string(keyword));
    if (keyword == "enum" && (!v.is_array() || v.empty())) {
      return absl::StrCat("'enum' at ", at, " is not a non-empty array");
    }
    if (keyword == "enum" && static_cast<int64_t>(v.size()) > limits_.max_enum) {
      return absl::StrCat("'enum' at ", at, " has ", v.size(), " values, more than the limit of ", limits_.max_enum);
    }
    std::vector<std::string> types;
    if (Problem p = Types(s, at, &types); p || types.empty()) return p;
    auto typed = [&](const Json& value) {
      return std::any_of(types.begin(), types.end(), [&](const std::string& t) { return OfType(value, t); });
    };
    if (keyword == "const") {
      if (!typed(v)) return absl::StrCat("'const' at ", at, " is not of the schema's 'type'");
      return std::nullopt;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (!typed(v[i])) return absl::StrCat("'enum' value ", i, " at ", at, " is not of the schema's 'type'");
    }
    return std::nullopt;
  }

  Problem Combinator(const Json& s, const Item& item) {
    const std::string at = At(item.path);
    const std::string keyword = s.contains("anyOf") ? "anyOf" : "allOf";
    if (Problem p = Beside(s, item, keyword)) return p;
    const Json& branches = s.at(keyword);
    if (!branches.is_array() || branches.empty()) {
      return absl::StrCat("'", keyword, "' at ", at, " is not a non-empty array");
    }
    // xgrammar generates an allOf of several branches as any JSON value, with a warning.
    if (keyword == "allOf" && branches.size() != 1) {
      return absl::StrCat("'allOf' with ", branches.size(), " branches at ", at, " is not supported (only one)");
    }
    if (static_cast<int64_t>(branches.size()) > limits_.max_enum) {
      return absl::StrCat("'anyOf' at ", at, " has ", branches.size(), " branches, more than the limit of ",
                          limits_.max_enum);
    }
    for (size_t i = 0; i < branches.size(); ++i) {
      Push(branches[i], item, PointerChild(PointerChild(item.path, keyword), std::to_string(i)));
    }
    return std::nullopt;
  }

  // What decides a schema without $ref, const, enum, anyOf or allOf: its type, or what xgrammar
  // infers (a string under propertyNames, else an object's or an array's keywords, else any value).
  Problem Typed(const Json& s, const Item& item) {
    const std::string at = At(item.path);
    std::vector<std::string> types;
    if (Problem p = Types(s, at, &types)) return p;
    auto has_any = [&](std::initializer_list<std::string_view> keywords) {
      return std::any_of(keywords.begin(), keywords.end(),
                         [&](std::string_view k) { return s.contains(std::string(k)); });
    };
    if (types.empty() && item.implied_string) types = {"string"};
    if (types.empty() && has_any({"properties", "additionalProperties", "unevaluatedProperties"})) types = {"object"};
    if (types.empty() && has_any({"items", "prefixItems", "unevaluatedItems"})) types = {"array"};
    auto of_types = [&](std::string_view key) {
      return std::any_of(types.begin(), types.end(), [&](const std::string& t) { return In(KeywordsOf(t), key); });
    };
    for (const auto& [key, value] : s.items()) {
      if (Neutral(key) || key == "type") continue;
      if (key == "multipleOf" && std::find(types.begin(), types.end(), "number") != types.end()) {
        return absl::StrCat("'multipleOf' at ", at, " is not supported on type 'number'");
      }
      if (of_types(key)) continue;
      if (types.empty()) return absl::StrCat("'", key, "' at ", at, " is not supported without a 'type'");
      return absl::StrCat("'", key, "' at ", at, " does not apply to type '", absl::StrJoin(types, "' or '"), "'");
    }
    for (const std::string& t : types) {
      Problem p;
      if (t == "integer") p = Bounds(s, at, /*integer=*/true);
      if (t == "integer" && !p) p = MultipleOf(s, at);
      if (t == "number") p = Bounds(s, at, /*integer=*/false);
      if (t == "string") p = String(s, at);
      if (t == "array") p = Array(s, item);
      if (t == "object") p = Object(s, item);
      if (p) return p;
    }
    return std::nullopt;
  }

  // minimum, maximum, exclusiveMinimum, exclusiveMaximum: numbers (whole ones for an integer) that
  // leave some value between them.
  Problem Bounds(const Json& s, const std::string& at, bool integer) const {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    double bound[4] = {-kInf, kInf, -kInf, kInf};
    const char* names[4] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 4; ++i) {
      const Json* v = Member(s, names[i]);
      if (v == nullptr) continue;
      if (!v->is_number()) return absl::StrCat("'", names[i], "' at ", at, " is not a number");
      bound[i] = v->get<double>();
      if (integer && (!IsWhole(*v) || std::fabs(bound[i]) > kMaxIntegerBound)) {
        return absl::StrCat("'", names[i], "' at ", at,
                            " is not a whole number between -2^53 and 2^53, as type 'integer' needs");
      }
    }
    if (bound[0] > bound[1]) {
      return absl::StrCat("'minimum' ", s.at("minimum").dump(), " is greater than 'maximum' ", s.at("maximum").dump(),
                          " at ", at);
    }
    // Exclusive bounds: an integer's move to the next whole number; a number's must not be met.
    const double low = std::max(bound[0], integer ? bound[2] + 1 : bound[2]);
    const double high = std::min(bound[1], integer ? bound[3] - 1 : bound[3]);
    const bool open = !integer && (low == bound[2] || high == bound[3]);
    if (low > high || (low == high && open)) return absl::StrCat("the bounds at ", at, " leave no value between them");
    return std::nullopt;
  }

  Problem MultipleOf(const Json& s, const std::string& at) const {
    const Json* m = Member(s, "multipleOf");
    if (m == nullptr) return std::nullopt;
    if (!m->is_number() || !IsWhole(*m) || m->get<double>() < 1 || m->get<double>() > kMaxMultipleOf) {
      return absl::StrCat("'multipleOf' at ", at, " is not a whole number from 1 to ", kMaxMultipleOf);
    }
    for (std::string_view bound : kNumberKeywords) {
      if (s.contains(std::string(bound))) {
        return absl::StrCat("'multipleOf' beside '", V(bound), "' at ", at, " is not supported");
      }
    }
    return std::nullopt;
  }

  // A count keyword (minLength, maxItems, ...): a non-negative integer within `limit`.
  Problem CountOf(const Json& s, std::string_view key, const std::string& at, int64_t limit,
                  std::optional<int64_t>* out) const {
    const Json* v = Member(s, key);
    if (v == nullptr) return std::nullopt;
    *out = Count(*v);
    if (!*out) return absl::StrCat("'", V(key), "' at ", at, " is not a non-negative integer");
    if (**out > limit) return absl::StrCat("'", V(key), "' ", **out, " at ", at, " is more than the limit of ", limit);
    return std::nullopt;
  }

  // A pair like minLength and maxLength: each a count within `limit`, the first not above the second.
  Problem Range(const Json& s, std::string_view min_key, std::string_view max_key, const std::string& at,
                int64_t limit) const {
    std::optional<int64_t> low;
    std::optional<int64_t> high;
    if (Problem p = CountOf(s, min_key, at, limit, &low)) return p;
    if (Problem p = CountOf(s, max_key, at, limit, &high)) return p;
    if (low && high && *low > *high) {
      return absl::StrCat("'", V(min_key), "' ", *low, " is greater than '", V(max_key), "' ", *high, " at ", at);
    }
    return std::nullopt;
  }

  Problem String(const Json& s, const std::string& at) const {
    const Json* pattern = Member(s, "pattern");
    const Json* format = Member(s, "format");
    if (pattern != nullptr) {
      if (!pattern->is_string()) return absl::StrCat("'pattern' at ", at, " is not a string");
      if (Problem p = constrain::RegexProblem(pattern->get_ref<const std::string&>(), limits_)) {
        return absl::StrCat("'pattern' at ", at, ": ", *p);
      }
    }
    if (format != nullptr && (!format->is_string() || !In(kFormats, format->get_ref<const std::string&>()))) {
      return absl::StrCat("'format' ", format->dump(), " at ", at, " is not supported");
    }
    if (pattern != nullptr && format != nullptr) {
      return absl::StrCat("'pattern' beside 'format' at ", at, " is not supported");
    }
    const char* generative = pattern != nullptr ? "pattern" : "format";
    for (const char* length : {"minLength", "maxLength"}) {
      if (s.contains(length) && (pattern != nullptr || format != nullptr)) {
        return absl::StrCat("'", length, "' beside '", generative, "' at ", at, " is not supported");
      }
    }
    return Range(s, "minLength", "maxLength", at, limits_.max_repeat);
  }

  // items, unevaluatedItems, additionalProperties, unevaluatedProperties: a schema, or `false`
  // (nothing more), which is no schema of its own.
  Problem Subschema(const Json& s, std::string_view key, const Item& item) {
    const Json* v = Member(s, key);
    if (v == nullptr || (v->is_boolean() && !v->get<bool>())) return std::nullopt;
    if (!v->is_object() && !v->is_boolean()) {
      return absl::StrCat("'", V(key), "' at ", At(item.path), " is not a schema (an object or a boolean)");
    }
    Push(*v, item, PointerChild(item.path, key));
    return std::nullopt;
  }

  Problem Array(const Json& s, const Item& item) {
    const std::string at = At(item.path);
    // xgrammar reads unevaluatedItems only where items is absent.
    if (s.contains("items") && s.contains("unevaluatedItems")) {
      return absl::StrCat("'unevaluatedItems' beside 'items' at ", at, " is not supported");
    }
    for (const char* key : {"items", "unevaluatedItems"}) {
      if (Problem p = Subschema(s, key, item)) return p;
    }
    size_t prefix_count = 0;
    if (const Json* prefix = Member(s, "prefixItems")) {
      if (!prefix->is_array()) return absl::StrCat("'prefixItems' at ", at, " is not an array");
      prefix_count = prefix->size();
      if (static_cast<int64_t>(prefix_count) > limits_.max_repeat) {
        return absl::StrCat("'prefixItems' at ", at, " has ", prefix_count, " schemas, more than the limit of ",
                            limits_.max_repeat);
      }
      for (size_t i = 0; i < prefix_count; ++i) {
        // xgrammar takes objects only here (a boolean is an error).
        if (!(*prefix)[i].is_object()) return absl::StrCat("'prefixItems' entry ", i, " at ", at, " is not an object");
        Push((*prefix)[i], item, PointerChild(PointerChild(item.path, "prefixItems"), std::to_string(i)));
      }
    }
    if (Problem p = Range(s, "minItems", "maxItems", at, limits_.max_repeat)) return p;
    if (const Json* max = Member(s, "maxItems");
        max != nullptr && max->get<int64_t>() < static_cast<int64_t>(prefix_count)) {
      return absl::StrCat("'maxItems' ", max->get<int64_t>(), " at ", at, " is fewer than its ", prefix_count,
                          " 'prefixItems'");
    }
    return std::nullopt;
  }

  Problem Object(const Json& s, const Item& item) {
    const std::string at = At(item.path);
    const Json* properties = Member(s, "properties");
    const Json* patterns = Member(s, "patternProperties");
    if (properties != nullptr && !properties->is_object()) {
      return absl::StrCat("'properties' at ", at, " is not an object");
    }
    if (patterns != nullptr && !patterns->is_object()) {
      return absl::StrCat("'patternProperties' at ", at, " is not an object");
    }
    const size_t count = (properties ? properties->size() : 0) + (patterns ? patterns->size() : 0);
    if (static_cast<int64_t>(count) > limits_.max_properties) {
      return absl::StrCat("the object at ", at, " has ", count, " properties, more than the limit of ",
                          limits_.max_properties);
    }
    if (properties != nullptr) {
      for (const auto& [name, schema] : properties->items()) {
        Push(schema, item, PointerChild(PointerChild(item.path, "properties"), name));
      }
    }
    if (patterns != nullptr) {
      for (const auto& [regex, schema] : patterns->items()) {
        if (Problem p = constrain::RegexProblem(regex, limits_)) {
          return absl::StrCat("'patternProperties' key '", regex, "' at ", at, ": ", *p);
        }
        Push(schema, item, PointerChild(PointerChild(item.path, "patternProperties"), regex));
      }
    }
    if (Problem p = Required(s, properties, at)) return p;
    if (s.contains("additionalProperties") && s.contains("unevaluatedProperties")) {
      return absl::StrCat("'unevaluatedProperties' beside 'additionalProperties' at ", at, " is not supported");
    }
    for (const char* key : {"additionalProperties", "unevaluatedProperties"}) {
      if (Problem p = Subschema(s, key, item)) return p;
    }
    if (const Json* names = Member(s, "propertyNames")) {
      const Json* type = names->is_object() ? Member(*names, "type") : nullptr;
      if (!names->is_object() || (type != nullptr && *type != "string")) {
        return absl::StrCat("'propertyNames' at ", at, " is not a schema of strings");
      }
      Push(*names, item, PointerChild(item.path, "propertyNames"), /*implied_string=*/true);
    }
    return Range(s, "minProperties", "maxProperties", at, limits_.max_properties);
  }

  // Each required name must be a listed property: xgrammar makes only listed properties required.
  Problem Required(const Json& s, const Json* properties, const std::string& at) const {
    const Json* required = Member(s, "required");
    if (required == nullptr) return std::nullopt;
    if (!required->is_array()) return absl::StrCat("'required' at ", at, " is not an array");
    const Json* additional = Member(s, "additionalProperties");
    const bool closed = additional != nullptr && additional->is_boolean() && !additional->get<bool>();
    for (const Json& name : *required) {
      if (!name.is_string()) return absl::StrCat("'required' at ", at, " lists ", name.dump(), ", not a name");
      if (properties != nullptr && properties->contains(name.get_ref<const std::string&>())) continue;
      return absl::StrCat("'required' names '", name.get<std::string>(), "' at ", at, ", which ",
                          closed ? "'additionalProperties: false' forbids" : "'properties' does not list");
    }
    return std::nullopt;
  }

  // Every $ref names a schema the walk checked, and no chain of them comes back to itself without a
  // schema between (xgrammar's grammar for that accepts nothing).
  Problem CheckRefs() const {
    for (const Ref& ref : refs_) {
      if (!schemas_.contains(ref.target)) {
        return absl::StrCat("'$ref' '", ref.uri, "' at ", At(ref.from), " names no schema in the document");
      }
    }
    std::unordered_map<std::string, int> state;  // 1: on the chain being followed; 2: leads to a schema
    for (const auto& [start, unused] : pure_refs_) {
      std::vector<const std::string*> chain;
      const std::string* at = &start;
      for (auto it = pure_refs_.find(*at); it != pure_refs_.end(); it = pure_refs_.find(*at)) {
        int& s = state[*at];
        if (s == 2) break;
        if (s == 1) return absl::StrCat("'$ref' at ", At(*at), " is in a cycle of $refs with no schema between them");
        s = 1;
        chain.push_back(at);
        at = &it->second;
      }
      for (const std::string* p : chain) state[*p] = 2;
    }
    return std::nullopt;
  }

  const ConstraintLimits& limits_;
  std::string prefix_;
  std::vector<Item> stack_;                                 // [schemas still to check]
  std::unordered_set<std::string> schemas_;                 // the pointers of the schemas checked
  std::vector<Ref> refs_;                                   // [$refs]
  std::unordered_map<std::string, std::string> pure_refs_;  // schema decided by a $ref -> its target
};

}  // namespace

std::optional<std::string> JsonSchemaProblem(const nlohmann::json& schema, const ConstraintLimits& limits,
                                             const std::string& prefix) {
  return SchemaWalk(limits, prefix).Run(schema);
}

}  // namespace specula::constrain
