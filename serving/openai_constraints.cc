#include "serving/openai_constraints.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::ordered_json;  // a schema keeps its properties in the order given
using Kind = ConstraintSpec::Kind;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool Present(const json& j, const char* f) { return j.is_object() && j.contains(f) && !j[f].is_null(); }

// A schema given as an object or as a JSON string holding one (vLLM takes both).
absl::StatusOr<std::string> SchemaText(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    json parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
      return Bad(field, "must be a JSON Schema (an object, or a string holding one)");
    }
    return parsed.dump();
  }
  return Bad(field, absl::StrCat("must be a JSON Schema object, got ", v.type_name()));
}

absl::StatusOr<std::string> Text(const json& v, const std::string& field) {
  if (!v.is_string()) return Bad(field, absl::StrCat("must be a string, got ", v.type_name()));
  return v.get<std::string>();
}

absl::StatusOr<std::vector<std::string>> Choices(const json& v, const std::string& field) {
  if (!v.is_array()) return Bad(field, absl::StrCat("must be an array of strings, got ", v.type_name()));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return Bad(absl::StrCat(field, "[", i, "]"), "must be a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

// One candidate source: its field and what it asks for.
struct Source {
  std::string field;
  ConstraintSpec spec;
};

absl::StatusOr<ConstraintSpec> FromResponseFormat(const json& rf) {
  if (!rf.is_object()) return Bad("response_format", "must be an object with a \"type\"");
  const std::string type = rf.value("type", std::string());
  for (const auto& [key, value] : rf.items()) {
    if (key != "type" && key != "json_schema") return Bad(absl::StrCat("response_format.", key), "unknown field");
  }
  if (type == "text") return ConstraintSpec{};
  if (type == "json_object") return ConstraintSpec{Kind::kJsonObject, "", {}, "response_format"};
  if (type != "json_schema") {
    return Bad("response_format.type", absl::StrCat("must be text, json_object or json_schema, got \"", type, "\""));
  }
  if (!Present(rf, "json_schema") || !rf["json_schema"].is_object()) {
    return Bad("response_format.json_schema", "missing: an object with \"name\" and \"schema\"");
  }
  const json& js = rf["json_schema"];
  for (const auto& [key, value] : js.items()) {
    if (key != "name" && key != "schema" && key != "strict" && key != "description") {
      return Bad(absl::StrCat("response_format.json_schema.", key), "unknown field");
    }
  }
  if (Present(js, "strict") && !js["strict"].is_boolean()) return Bad("response_format.json_schema.strict", "must be a boolean");
  // Strict or not, the schema is enforced, with additionalProperties false where it says nothing.
  const std::string field = "response_format.json_schema.schema";
  if (!Present(js, "schema")) return Bad(field, "missing");
  ASSIGN_OR_RETURN(std::string text, SchemaText(js["schema"], field));
  return ConstraintSpec{Kind::kJsonSchema, std::move(text), {}, field};
}

// A constraint of `kind` from a field's value: a schema (an object, or a string holding one), a
// structural tag (likewise), the choices, or the text of a regex or grammar.
absl::StatusOr<ConstraintSpec> FromValue(Kind kind, const json& v, const std::string& field) {
  if (kind == Kind::kChoice) {
    ASSIGN_OR_RETURN(std::vector<std::string> choices, Choices(v, field));
    return ConstraintSpec{kind, "", std::move(choices), field};
  }
  std::string text;
  if (kind == Kind::kJsonSchema) {
    ASSIGN_OR_RETURN(text, SchemaText(v, field));
  } else if (kind == Kind::kStructuralTag && v.is_object()) {
    text = v.dump();
  } else {
    ASSIGN_OR_RETURN(text, Text(v, field));
  }
  return ConstraintSpec{kind, std::move(text), {}, field};
}

// vLLM's structured_outputs object.
absl::StatusOr<ConstraintSpec> FromStructuredOutputs(const json& so) {
  if (!so.is_object()) return Bad("structured_outputs", "must be an object");
  static constexpr std::pair<const char*, Kind> kKeys[] = {{"json", Kind::kJsonSchema}, {"regex", Kind::kRegex},
                                                           {"grammar", Kind::kGrammar}, {"choice", Kind::kChoice},
                                                           {"structural_tag", Kind::kStructuralTag}};
  std::vector<ConstraintSpec> found;
  bool compact = false;
  for (const auto& item : so.items()) {
    const std::string& key = item.key();
    const json& value = item.value();
    const std::string field = absl::StrCat("structured_outputs.", key);
    if (value.is_null()) continue;
    if (key == "disable_any_whitespace") {
      if (!value.is_boolean()) return Bad(field, "must be a boolean");
      compact = value.get<bool>();
      continue;
    }
    const auto* known = std::find_if(std::begin(kKeys), std::end(kKeys), [&](const auto& k) { return key == k.first; });
    if (known != std::end(kKeys)) {
      ASSIGN_OR_RETURN(ConstraintSpec spec, FromValue(known->second, value, field));
      found.push_back(std::move(spec));
    } else if (key == "json_object") {
      if (!value.is_boolean()) return Bad(field, "must be a boolean");
      if (value.get<bool>()) found.push_back({Kind::kJsonObject, "", {}, field});
    } else {
      // whitespace_pattern, disable_additional_properties...: not built.
      return Bad(field, "not supported");
    }
  }
  if (found.size() > 1) return Bad("structured_outputs", "set exactly one of json, regex, choice, grammar, json_object");
  if (!compact) return found.empty() ? ConstraintSpec{} : found[0];
  if (found.empty() || (found[0].kind != Kind::kJsonSchema && found[0].kind != Kind::kJsonObject)) {
    return Bad("structured_outputs.disable_any_whitespace", "applies to json and json_object only");
  }
  found[0].compact_json = true;
  return found[0];
}

// Every source of the body, in the order the fields are named when two meet.
absl::StatusOr<std::vector<Source>> Sources(const json& j) {
  std::vector<Source> out;
  auto add = [&out](const char* field, absl::StatusOr<ConstraintSpec> s) -> absl::Status {
    if (!s.ok()) return s.status();
    if (s->active()) out.push_back({field, *std::move(s)});
    return absl::OkStatus();
  };
  if (Present(j, "response_format")) RETURN_IF_ERROR(add("response_format", FromResponseFormat(j["response_format"])));
  if (Present(j, "structured_outputs")) {
    RETURN_IF_ERROR(add("structured_outputs", FromStructuredOutputs(j["structured_outputs"])));
  }
  // vLLM's older names and llama.cpp's, each a field of its own.
  static constexpr std::pair<const char*, Kind> kFields[] = {
      {"guided_json", Kind::kJsonSchema}, {"guided_regex", Kind::kRegex}, {"guided_grammar", Kind::kGrammar},
      {"grammar", Kind::kGrammar},        {"json_schema", Kind::kJsonSchema}, {"guided_choice", Kind::kChoice}};
  for (const auto& [field, kind] : kFields) {
    if (Present(j, field)) RETURN_IF_ERROR(add(field, FromValue(kind, j[field], field)));
  }
  return out;
}

}  // namespace

absl::Status ParseConstraintFields(const json& body, ConstraintSpec* out) {
  *out = ConstraintSpec{};
  for (const char* f : {"guided_decoding_backend", "guided_whitespace_pattern"}) {
    if (Present(body, f)) return Bad(f, "not supported: the grammar engine is fixed, and whitespace is bounded");
  }
  ASSIGN_OR_RETURN(std::vector<Source> sources, Sources(body));
  if (sources.size() > 1) {
    std::vector<std::string> names;
    for (const Source& s : sources) names.push_back(s.field);
    return Bad(names[1], absl::StrCat("cannot be combined with ", names[0], ": set one structured-output field"));
  }
  if (!sources.empty()) *out = std::move(sources[0].spec);
  return absl::OkStatus();
}

}  // namespace specula
