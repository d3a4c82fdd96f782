#include "serving/openai_constraints.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// vLLM's structured_outputs object; `prefix` names it in errors.
absl::StatusOr<ConstraintSpec> FromStructuredOutputs(const json& so) {
  if (!so.is_object()) return Bad("structured_outputs", "must be an object");
  std::vector<ConstraintSpec> found;
  for (const auto& [key, value] : so.items()) {
    const std::string field = absl::StrCat("structured_outputs.", key);
    if (value.is_null()) continue;
    if (key == "json") {
      ASSIGN_OR_RETURN(std::string t, SchemaText(value, field));
      found.push_back({Kind::kJsonSchema, std::move(t), {}, field});
    } else if (key == "regex" || key == "grammar" || key == "structural_tag") {
      ASSIGN_OR_RETURN(std::string t, key == "structural_tag" && value.is_object() ? value.dump() : Text(value, field));
      found.push_back({key == "regex" ? Kind::kRegex : key == "grammar" ? Kind::kGrammar : Kind::kStructuralTag,
                       std::move(t), {}, field});
    } else if (key == "choice") {
      ASSIGN_OR_RETURN(std::vector<std::string> c, Choices(value, field));
      found.push_back({Kind::kChoice, "", std::move(c), field});
    } else if (key == "json_object") {
      if (!value.is_boolean()) return Bad(field, "must be a boolean");
      if (value.get<bool>()) found.push_back({Kind::kJsonObject, "", {}, field});
    } else {
      // disable_any_whitespace, whitespace_pattern, disable_additional_properties...: not built.
      return Bad(field, "not supported");
    }
  }
  if (found.size() > 1) return Bad("structured_outputs", "set exactly one of json, regex, choice, grammar, json_object");
  return found.empty() ? ConstraintSpec{} : found[0];
}

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
  if (Present(j, "guided_json")) {
    auto t = SchemaText(j["guided_json"], "guided_json");
    RETURN_IF_ERROR(add("guided_json", t.ok() ? absl::StatusOr<ConstraintSpec>(ConstraintSpec{Kind::kJsonSchema, *t, {}, "guided_json"})
                                             : t.status()));
  }
  for (auto [field, kind] : {std::pair{"guided_regex", Kind::kRegex}, std::pair{"guided_grammar", Kind::kGrammar},
                             std::pair{"grammar", Kind::kGrammar}}) {
    if (!Present(j, field)) continue;
    auto t = Text(j[field], field);
    RETURN_IF_ERROR(add(field, t.ok() ? absl::StatusOr<ConstraintSpec>(ConstraintSpec{kind, *t, {}, field}) : t.status()));
  }
  if (Present(j, "json_schema")) {
    auto t = SchemaText(j["json_schema"], "json_schema");
    RETURN_IF_ERROR(add("json_schema", t.ok() ? absl::StatusOr<ConstraintSpec>(ConstraintSpec{Kind::kJsonSchema, *t, {}, "json_schema"})
                                             : t.status()));
  }
  if (Present(j, "guided_choice")) {
    auto c = Choices(j["guided_choice"], "guided_choice");
    RETURN_IF_ERROR(add("guided_choice", c.ok() ? absl::StatusOr<ConstraintSpec>(ConstraintSpec{Kind::kChoice, "", *c, "guided_choice"})
                                               : c.status()));
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
