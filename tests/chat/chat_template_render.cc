// Renders chat templates for tests/chat/python/test_chat_template.py.
//
//   chat_template_render CASE.json
//
// CASE.json is {template, messages: [{role, content}], add_generation_prompt, bos_token,
// eos_token}, optionally with "extra" (string variables) and "now" (the Unix time strftime_now()
// formats, in UTC). With "variables" (a JSON object) instead of messages..eos_token, the template
// is rendered with exactly those variables (ChatTemplate::RenderJson). With "wire_messages" (a
// messages file's JSON, OpenAI's shape: ParseMessagesJson) and "wire_tools" (OpenAI's tools:
// [{"type": "function", "function": {"name", "description", "parameters"}}]) instead of "messages",
// the chat side's own conversion to template variables is rendered (ChatTemplate::Render with
// tools). Prints the rendering to stdout, or the error to stderr with exit status 1.
//
// CASE.json may also be a JSON array of such cases: then one JSON array comes out, with
// {"ok": true, "output": ...} or {"ok": false, "error": ...} per case (one process for many cases).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chat/chat.h"
#include "chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace {

using json = nlohmann::ordered_json;

std::vector<specula::ChatTool> WireTools(const json& c) {
  std::vector<specula::ChatTool> tools;
  for (const auto& t : c.value("wire_tools", json::array())) {
    const json& f = t.at("function");
    tools.push_back({f.at("name").get<std::string>(), f.value("description", std::string()),
                     f.contains("parameters") ? f["parameters"].dump() : std::string()});
  }
  return tools;
}

absl::StatusOr<std::string> RenderCase(const json& c) {
  auto tmpl = specula::ChatTemplate::Parse(c.at("template").get<std::string>());
  if (!tmpl.ok()) return tmpl.status();
  if (c.contains("now")) tmpl->set_fixed_time(c["now"].get<std::time_t>());
  if (c.contains("variables")) return tmpl->RenderJson(c["variables"].dump());
  std::vector<specula::ChatMessage> messages;
  if (c.contains("wire_messages")) {
    auto parsed = specula::ParseMessagesJson(c["wire_messages"].dump(), "wire_messages");
    if (!parsed.ok()) return parsed.status();
    messages = *std::move(parsed);
  } else {
    for (const auto& m : c.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
  }
  std::map<std::string, std::string> extra;
  if (c.contains("extra")) {
    for (const auto& [k, v] : c["extra"].items()) extra[k] = v.get<std::string>();
  }
  return tmpl->Render(messages, WireTools(c), c.value("add_generation_prompt", false),
                      c.value("bos_token", std::string()), c.value("eos_token", std::string()), extra);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: chat_template_render CASE.json\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::cerr << argv[1] << ": cannot read\n";
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  const json input = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded()) {
    std::cerr << argv[1] << ": not JSON\n";
    return 2;
  }
  if (input.is_array()) {
    json results = json::array();
    for (const auto& c : input) {
      auto r = RenderCase(c);
      results.push_back(r.ok() ? json{{"ok", true}, {"output", *r}}
                               : json{{"ok", false}, {"error", std::string(r.status().message())}});
    }
    std::cout << results.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  auto r = RenderCase(input);
  if (!r.ok()) {
    std::cerr << r.status().message() << "\n";
    return 1;
  }
  std::fwrite(r->data(), 1, r->size(), stdout);
  return 0;
}
