#include "serving/tool_calls.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

// Keys in the order given: a tool's parameters reach the template and the schema as written.
using json = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kEnd = "}\n</tool_call>";

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// ---- The request's fields ---------------------------------------------------------------------

// A field's JSON, null when the text is empty.
absl::StatusOr<json> ParseField(std::string_view text, const std::string& field) {
  if (text.empty()) return json(nullptr);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(field, "not JSON");
  return j;
}

bool Given(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// OpenAI's rule (letters, digits, underscores, dashes, at most 64), with dots: the name is spliced
// into the prompt and the constraint's tags, so nothing in it needs escaping.
bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

// A function object {"name", "description", "parameters", "strict"} at `field`.
absl::StatusOr<ChatTool> ParseFunction(const json& f, const std::string& field) {
  if (!f.is_object()) return Bad(field, "must be an object");
  if (!Given(f, "name")) return Bad(field + ".name", "missing");
  if (!f["name"].is_string()) return Bad(field + ".name", "must be a string");
  ChatTool tool;
  tool.name = f["name"].get<std::string>();
  if (!ValidName(tool.name)) {
    return Bad(field + ".name",
               absl::StrCat("'", tool.name, "' must be 1 to 64 letters, digits, underscores, dashes or dots"));
  }
  if (Given(f, "description")) {
    if (!f["description"].is_string()) return Bad(field + ".description", "must be a string");
    tool.description = f["description"].get<std::string>();
  }
  if (Given(f, "parameters")) {
    if (!f["parameters"].is_object()) return Bad(field + ".parameters", "must be an object (a JSON Schema)");
    tool.parameters = f["parameters"].dump();
  }
  // strict asks for what the constraint does anyway.
  if (Given(f, "strict") && !f["strict"].is_boolean()) return Bad(field + ".strict", "must be a boolean");
  return tool;
}

// tools: [{"type": "function", "function": {...}}]; functions (legacy): [{...}].
absl::StatusOr<std::vector<ChatTool>> ParseTools(const json& list, bool legacy) {
  const char* name = legacy ? "functions" : "tools";
  if (!list.is_array()) return Bad(name, "must be a list");
  std::vector<ChatTool> tools;
  std::set<std::string> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string field = absl::StrCat(name, "[", i, "]");
    if (!legacy) {
      const json& t = list[i];
      if (!t.is_object()) return Bad(field, "must be an object");
      if (!Given(t, "type")) return Bad(field + ".type", "missing");
      if (t["type"] != "function") return Bad(field + ".type", "only \"function\" is supported");
      if (!Given(t, "function")) return Bad(field + ".function", "missing");
      field += ".function";
    }
    ASSIGN_OR_RETURN(ChatTool tool, ParseFunction(legacy ? list[i] : list[i]["function"], field));
    if (!seen.insert(tool.name).second) return Bad(field + ".name", absl::StrCat("'", tool.name, "' is given twice"));
    tools.push_back(std::move(tool));
  }
  return tools;
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}};
// function_call (legacy): "none" | "auto" | {"name"}.
absl::Status ParseChoice(const json& c, bool legacy, ToolRequest* r) {
  const std::string field = legacy ? "function_call" : "tool_choice";
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s == "none") r->choice = ToolChoice::kNone;
    else if (s == "auto") r->choice = ToolChoice::kAuto;
    else if (s == "required" && !legacy) r->choice = ToolChoice::kRequired;
    else return Bad(field, absl::StrCat("'", s, "' is not one of ", legacy ? "none, auto" : "none, auto, required",
                                        " or a function"));
    return absl::OkStatus();
  }
  if (!c.is_object()) {
    return Bad(field, legacy ? "must be \"none\", \"auto\" or {\"name\": ...}"
                             : "must be \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  const json* f = &c;
  std::string name_field = field + ".name";
  if (!legacy) {
    if (!Given(c, "type")) return Bad(field + ".type", "missing");
    if (c["type"] != "function") return Bad(field + ".type", "only \"function\" is supported");
    if (!Given(c, "function") || !c["function"].is_object()) return Bad(field + ".function", "must be {\"name\": ...}");
    f = &c["function"];
    name_field = field + ".function.name";
  }
  if (!Given(*f, "name")) return Bad(name_field, "missing");
  if (!(*f)["name"].is_string()) return Bad(name_field, "must be a string");
  r->choice = ToolChoice::kNamed;
  r->function = (*f)["name"].get<std::string>();
  return absl::OkStatus();
}

// Which list and choice the request uses: tools with tool_choice, or functions with function_call.
absl::Status CheckPairing(const json& tools, const json& choice, const json& functions, const json& call) {
  if (!tools.is_null() && !functions.is_null()) return Bad("functions", "give tools or functions, not both");
  if (!choice.is_null() && !call.is_null()) return Bad("function_call", "give tool_choice or function_call, not both");
  if (!call.is_null() && functions.is_null()) {
    return Bad("function_call", "goes with functions (tool_choice goes with tools)");
  }
  if (!choice.is_null() && !functions.is_null()) {
    return Bad("tool_choice", "goes with tools (function_call goes with functions)");
  }
  return absl::OkStatus();
}

// ---- Reading calls from the output ----------------------------------------------------------

bool IsJsonSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The longest suffix of `s` that is a proper prefix of `tag`: what may still become the tag.
size_t PartialTag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// A call's arguments from the text after its header: less trailing whitespace, the call object's
// closing brace and the whitespace before it.
std::string_view TrimArguments(std::string_view a) {
  while (!a.empty() && IsJsonSpace(a.back())) a.remove_suffix(1);
  if (!a.empty() && a.back() == '}') a.remove_suffix(1);
  while (!a.empty() && IsJsonSpace(a.back())) a.remove_suffix(1);
  return a;
}

// Whether a block opens as {"name": "NAME", "arguments": , read as far as it goes. `ended`: the
// block has all its text, so arguments may be empty.
struct Header {
  enum class Result : uint8_t { kMore, kNo, kYes };
  Result result = Result::kMore;
  std::string name;
  size_t args_begin = 0;
};

Header MatchHeader(std::string_view b, bool ended) {
  Header h;
  size_t i = 0;
  auto skip = [&] { while (i < b.size() && IsJsonSpace(b[i])) ++i; };
  // 1: matched; 0: the text ends inside it; -1: something else.
  auto literal = [&](std::string_view s) {
    const size_t n = std::min(s.size(), b.size() - i);
    if (b.substr(i, n) != s.substr(0, n)) return -1;
    if (n < s.size()) return 0;
    i += n;
    return 1;
  };
  for (std::string_view s : {"{", "\"name\"", ":", "\""}) {
    skip();
    const int m = literal(s);
    if (m <= 0) return {m < 0 ? Header::Result::kNo : Header::Result::kMore, "", 0};
  }
  const size_t name_begin = i;
  while (i < b.size() && b[i] != '"') {
    if (b[i] == '\\' || static_cast<unsigned char>(b[i]) < 0x20) return {Header::Result::kNo, "", 0};
    ++i;
  }
  if (i == b.size()) return h;
  if (i == name_begin) return {Header::Result::kNo, "", 0};
  h.name = std::string(b.substr(name_begin, i - name_begin));
  ++i;
  for (std::string_view s : {",", "\"arguments\"", ":"}) {
    skip();
    const int m = literal(s);
    if (m <= 0) return {m < 0 ? Header::Result::kNo : Header::Result::kMore, "", 0};
  }
  skip();
  if (i == b.size() && !ended) return {Header::Result::kMore, "", 0};
  h.result = Header::Result::kYes;
  h.args_begin = i;
  return h;
}

// Appends, merged into the last event when it is of the same kind and call.
void Emit(std::vector<ToolStreamEvent>* out, ToolStreamEvent::Kind kind, int index, std::string_view text) {
  if (text.empty()) return;
  if (!out->empty() && out->back().kind == kind && out->back().index == index) {
    out->back().text += text;
    return;
  }
  ToolStreamEvent e;
  e.kind = kind;
  e.index = index;
  e.text = std::string(text);
  out->push_back(std::move(e));
}

}  // namespace

absl::StatusOr<ToolRequest> ParseToolRequest(std::string_view tools_json, std::string_view tool_choice_json,
                                             std::optional<bool> parallel_tool_calls, std::string_view functions_json,
                                             std::string_view function_call_json) {
  ASSIGN_OR_RETURN(const json tools, ParseField(tools_json, "tools"));
  ASSIGN_OR_RETURN(const json choice, ParseField(tool_choice_json, "tool_choice"));
  ASSIGN_OR_RETURN(const json functions, ParseField(functions_json, "functions"));
  ASSIGN_OR_RETURN(const json call, ParseField(function_call_json, "function_call"));
  RETURN_IF_ERROR(CheckPairing(tools, choice, functions, call));
  ToolRequest r;
  r.legacy = !functions.is_null();
  const json& list = r.legacy ? functions : tools;
  if (!list.is_null()) {
    ASSIGN_OR_RETURN(r.tools, ParseTools(list, r.legacy));
  }
  r.choice = r.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  const json& c = r.legacy ? call : choice;
  const char* field = r.legacy ? "function_call" : "tool_choice";
  if (!c.is_null()) RETURN_IF_ERROR(ParseChoice(c, r.legacy, &r));
  if (r.choice == ToolChoice::kNamed &&
      std::none_of(r.tools.begin(), r.tools.end(), [&](const ChatTool& t) { return t.name == r.function; })) {
    return Bad(field, absl::StrCat("function '", r.function, "' is not in ", r.legacy ? "functions" : "tools"));
  }
  // An empty list, as vLLM takes it, leaves auto nothing to call.
  if (r.tools.empty() && r.choice == ToolChoice::kAuto && !list.is_null()) r.choice = ToolChoice::kNone;
  if (r.tools.empty() && r.choice != ToolChoice::kNone) {
    return Bad(field, absl::StrCat("\"", c.get<std::string>(), "\" needs ", r.legacy ? "functions" : "tools"));
  }
  // The older API answers with one function_call.
  r.parallel = r.legacy ? false : parallel_tool_calls.value_or(true);
  return r;
}

ConstraintSpec ToolConstraint(const ToolRequest& request) {
  ConstraintSpec spec;
  if (request.choice == ToolChoice::kNone) return spec;
  json tags = json::array();
  for (const ChatTool& t : request.tools) {
    if (request.choice == ToolChoice::kNamed && t.name != request.function) continue;
    json schema = json{{"type", "object"}, {"properties", json::object()}};
    if (!t.parameters.empty()) {
      schema = json::parse(t.parameters, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) schema = t.parameters;
    }
    tags.push_back({{"type", "tag"},
                    {"begin", absl::StrCat(std::string(kOpen), "\n{\"name\": \"", t.name, "\", \"arguments\": ")},
                    {"content", {{"type", "json_schema"}, {"json_schema", std::move(schema)}}},
                    {"end", std::string(kEnd)}});
  }
  json format;
  if (request.choice == ToolChoice::kAuto) {
    format = {{"type", "triggered_tags"}, {"triggers", json::array({std::string(kOpen)})}, {"tags", std::move(tags)},
              {"at_least_one", false}, {"stop_after_first", !request.parallel}};
  } else {
    format = {{"type", "tags_with_separator"}, {"tags", std::move(tags)}, {"separator", "\n"},
              {"at_least_one", true}, {"stop_after_first", !request.parallel}};
  }
  spec.kind = ConstraintSpec::Kind::kStructuralTag;
  spec.text = json{{"type", "structural_tag"}, {"format", std::move(format)}}.dump();
  spec.field = request.legacy ? "functions" : "tools";
  return spec;
}

std::string ToolCallId(std::string_view request_id, int index) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a of the id, then SplitMix64 per 32 bits
  for (unsigned char c : request_id) h = (h ^ c) * 1099511628211ULL;
  h ^= static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ULL;
  std::string id = "call_";
  for (int part = 0; part < 3; ++part) {
    uint64_t z = (h += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", static_cast<uint32_t>(z >> 32));
    id += hex;
  }
  return id;
}

ToolCallStream::ToolCallStream(std::string request_id) : request_id_(std::move(request_id)) {}

std::vector<ToolStreamEvent> ToolCallStream::Feed(std::string_view delta) {
  Events out;
  (in_block_ ? block_ : pending_).append(delta);
  while (in_block_ ? StepBlock(false, &out) : StepText(false, &out)) {
  }
  return out;
}

std::vector<ToolStreamEvent> ToolCallStream::Finish() {
  Events out;
  while (in_block_ ? StepBlock(true, &out) : StepText(true, &out)) {
  }
  return out;
}

// Outside a block: gives the content up to "<tool_call>" and opens the block (true), or gives what
// cannot start the tag (false).
bool ToolCallStream::StepText(bool final, Events* out) {
  if (after_call_) {
    size_t ws = 0;
    while (ws < pending_.size() && IsJsonSpace(pending_[ws])) ++ws;
    const std::string_view rest = std::string_view(pending_).substr(ws);
    if (rest.empty()) {
      if (final) pending_.clear();
      return false;
    }
    if (rest.substr(0, kOpen.size()) == kOpen) {
      pending_.erase(0, ws);
    } else if (!final && kOpen.substr(0, rest.size()) == rest) {
      return false;
    }
    after_call_ = false;
  }
  const size_t open = pending_.find(kOpen);
  if (open != std::string::npos) {
    Emit(out, ToolStreamEvent::Kind::kContent, 0, std::string_view(pending_).substr(0, open));
    block_ = pending_.substr(open + kOpen.size());
    pending_.clear();
    in_block_ = true;
    searched_ = 0;
    head_ = Head::kUnknown;
    args_begin_ = args_sent_ = 0;
    return true;
  }
  const size_t give = pending_.size() - (final ? 0 : PartialTag(pending_, kOpen));
  Emit(out, ToolStreamEvent::Kind::kContent, 0, std::string_view(pending_).substr(0, give));
  pending_.erase(0, give);
  return false;
}

// Inside a block: closes it at "</tool_call>" (true: the text after it goes on outside), or reads
// its header and streams what arguments it can (false).
bool ToolCallStream::StepBlock(bool final, Events* out) {
  const size_t close = block_.find(kClose, searched_ >= kClose.size() ? searched_ - (kClose.size() - 1) : 0);
  if (close != std::string::npos || final) {
    std::string rest;
    if (close != std::string::npos) {
      rest = block_.substr(close + kClose.size());
      block_.resize(close);
    }
    CloseBlock(block_, close != std::string::npos, out);
    in_block_ = false;
    block_.clear();
    pending_ = std::move(rest);
    return close != std::string::npos;
  }
  searched_ = block_.size();
  if (head_ == Head::kUnknown) {
    Header h = MatchHeader(block_, false);
    if (h.result == Header::Result::kNo) head_ = Head::kOther;
    if (h.result == Header::Result::kYes) {
      StartCall(std::move(h.name), out);
      args_begin_ = h.args_begin;
    }
  }
  if (head_ == Head::kCall) {
    const std::string_view args = std::string_view(block_).substr(args_begin_);
    StreamArguments(TrimArguments(args.substr(0, args.size() - PartialTag(args, kClose))), out);
  }
  return false;
}

void ToolCallStream::CloseBlock(std::string_view block, bool closed, Events* out) {
  if (head_ == Head::kUnknown) {
    Header h = MatchHeader(block, true);
    if (h.result == Header::Result::kYes) {
      StartCall(std::move(h.name), out);
      args_begin_ = h.args_begin;
    }
  }
  if (head_ == Head::kCall) {
    // An output cut off inside "</tool_call>" ends the arguments where the tag began.
    const std::string_view args = block.substr(args_begin_);
    StreamArguments(TrimArguments(args.substr(0, args.size() - (closed ? 0 : PartialTag(args, kClose)))), out);
    after_call_ = true;
    return;
  }
  const json j = closed ? json::parse(block, nullptr, /*allow_exceptions=*/false) : json();
  if (j.is_object() && j.contains("name") && j["name"].is_string() && !j["name"].get<std::string>().empty() &&
      j.contains("arguments")) {
    StartCall(j["name"].get<std::string>(), out);
    Emit(out, ToolStreamEvent::Kind::kArguments, calls_ - 1, j["arguments"].dump());
    after_call_ = true;
    return;
  }
  Emit(out, ToolStreamEvent::Kind::kContent, 0,
       absl::StrCat(std::string(kOpen), std::string(block), closed ? std::string(kClose) : ""));
}

// Gives the arguments up to `upto` (a prefix of the block's arguments) not given yet.
void ToolCallStream::StreamArguments(std::string_view upto, Events* out) {
  if (upto.size() <= args_sent_) return;
  Emit(out, ToolStreamEvent::Kind::kArguments, calls_ - 1, upto.substr(args_sent_));
  args_sent_ = upto.size();
}

void ToolCallStream::StartCall(std::string name, Events* out) {
  head_ = Head::kCall;
  ToolStreamEvent e;
  e.kind = ToolStreamEvent::Kind::kCallStart;
  e.index = calls_;
  e.id = ToolCallId(request_id_, calls_);
  e.name = std::move(name);
  out->push_back(std::move(e));
  ++calls_;
}

ParsedToolCalls ExtractToolCalls(std::string_view text, std::string_view request_id) {
  ToolCallStream stream{std::string(request_id)};
  std::vector<ToolStreamEvent> events = stream.Feed(text);
  for (ToolStreamEvent& e : stream.Finish()) events.push_back(std::move(e));
  ParsedToolCalls out;
  for (ToolStreamEvent& e : events) {
    switch (e.kind) {
      case ToolStreamEvent::Kind::kContent: out.content += e.text; break;
      case ToolStreamEvent::Kind::kCallStart: out.calls.push_back({std::move(e.id), std::move(e.name), ""}); break;
      case ToolStreamEvent::Kind::kArguments: out.calls[e.index].arguments += e.text; break;
    }
  }
  return out;
}

}  // namespace specula
