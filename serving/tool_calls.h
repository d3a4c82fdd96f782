// OpenAI tool calls (vLLM-compatible) in the Hermes format that Qwen2.5 and
// models/chat_templates/smollm2_tools.jinja teach a model:
//   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
// The pieces the OpenAI surface wires in: the request's tools and tool_choice (ParseToolRequest),
// the structural tag that constrains the output to them (ToolConstraint), and the calls read back
// from the output, whole (ExtractToolCalls) or as it streams (ToolCallStream). Pure: no wire types;
// the JSON stays in the .cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "chat/chat_template.h"
#include "core/constraint_spec.h"

namespace specula {

enum class ToolChoice : uint8_t {
  kNone,      // no calls: the output is text (the template still lists the tools)
  kAuto,      // text, or calls once the model opens one
  kRequired,  // one call or more, nothing else
  kNamed,     // calls of `ToolRequest::function` only, at least one
};

struct ToolRequest {
  std::vector<ChatTool> tools;  // what the template lists; parameters: a JSON object's text or empty
  ToolChoice choice = ToolChoice::kNone;
  std::string function;  // kNamed: the function to call
  bool parallel = true;  // parallel_tool_calls: more than one call per output
  // From `functions` / `function_call`: OpenAI answers those with one `message.function_call`.
  bool legacy = false;

  // Whether the output is read for calls (ExtractToolCalls, ToolCallStream).
  bool parses_calls() const { return choice != ToolChoice::kNone; }
};

// The request's tool fields as JSON text, each empty when absent (JSON null reads as absent too):
// `tools` ([{"type": "function", "function": {"name", "description", "parameters", "strict"}}]),
// `tool_choice` ("none" | "auto" | "required" | {"type": "function", "function": {"name"}}),
// `parallel_tool_calls`, and OpenAI's older names for them, `functions` (the function objects) and
// `function_call` ("none" | "auto" | {"name"}), which answer with one call (`legacy`).
// tool_choice defaults to "auto" with tools and "none" without, as OpenAI's and vLLM's; "auto",
// "required" or a named function without tools is refused, as vLLM refuses them ("auto" with an
// empty list reads as "none"). A function's
// name is 1 to 64 letters, digits, underscores, dashes or dots (OpenAI's rule, with the dots vLLM
// lets through), unique within the request. Errors are InvalidArgument naming the field:
// "tools[1].function.name: missing", "tool_choice: function 'x' is not in tools",
// "tools[0].type: only \"function\" is supported", "functions[0].parameters: must be an object".
absl::StatusOr<ToolRequest> ParseToolRequest(std::string_view tools_json, std::string_view tool_choice_json,
                                             std::optional<bool> parallel_tool_calls,
                                             std::string_view functions_json = {},
                                             std::string_view function_call_json = {});

// What constrains the output to the request's calls: an xgrammar structural tag
// ({"type": "structural_tag", "format": ...}; kind kStructuralTag, field "tools", or "functions"
// for the older API) whose tags are
// begin "<tool_call>\n{\"name\": \"NAME\", \"arguments\": ", the function's parameters as a JSON
// schema ({"type": "object", "properties": {}} without them), end "}\n</tool_call>".
//   required, named: tags_with_separator (separator "\n", at_least_one), only the named
//                    function's tag for named; stop_after_first unless parallel
//   auto:            triggered_tags on "<tool_call>" (free text until a call opens), at_least_one
//                    false, stop_after_first unless parallel
//   none:            no constraint (kind kNone)
// A parameters text that is not JSON (ParseToolRequest refuses those) reaches the tag as a string,
// which the constraint compiler refuses naming the field.
ConstraintSpec ToolConstraint(const ToolRequest& request);

// "call_" and 24 hex digits, derived from the request id and the call's index in the output: the
// same output gets the same ids, whole or streamed.
std::string ToolCallId(std::string_view request_id, int index);

struct ParsedToolCalls {
  std::string content;                // the text outside the calls
  std::vector<ChatToolCall> calls;    // in order; ids from ToolCallId
};

// Splits a finished output into calls and content, by the rules of ToolCallStream (it runs one
// over the whole text), so a streamed output and the same output whole give the same calls.
ParsedToolCalls ExtractToolCalls(std::string_view text, std::string_view request_id);

// What the stream gives for one delta: content text, a call's start (index, id, name: OpenAI's
// first delta.tool_calls[{index, id, type, function: {name, arguments: ""}}]), or a piece of its
// arguments ({index, function: {arguments}}).
struct ToolStreamEvent {
  enum class Kind : uint8_t { kContent, kCallStart, kArguments };
  Kind kind = Kind::kContent;
  int index = 0;     // kCallStart, kArguments: the call's index in the output
  std::string id;    // kCallStart
  std::string name;  // kCallStart
  std::string text;  // kContent: content; kArguments: argument text
};

// Reads calls from an output as it streams. The rules, which ExtractToolCalls shares:
// - A block is the text between "<tool_call>" and the next "</tool_call>" (or the output's end).
// - A block that opens as {"name": "NAME", "arguments": (whitespace free between the tokens, NAME
//   without escapes) is a call: its start comes as soon as that much is read, and its arguments
//   are the text as generated from there to the block's end, less trailing whitespace, one closing
//   brace (the call object's) and the whitespace before it. They stream as they come, holding
//   back only what that trimming could drop and a partial "</tool_call>". An output cut off
//   inside a call (max_tokens) ends the call there (before a partial "</tool_call>"), its
//   arguments unfinished, as OpenAI's own truncated calls are; the arguments are not checked as
//   JSON, since streamed text cannot be taken back (under ToolConstraint they follow the schema).
// - Any other block that is a JSON object with a non-empty string "name" and an "arguments" is a
//   call whose arguments are their compact JSON, given whole when the block closes.
// - Every other block stays in the content, tags included, as does a partial "<tool_call>" at the
//   output's end. Content is held back only while it could be the start of "<tool_call>", and
//   whitespace after a call until what follows shows: whitespace between a call and the next
//   "<tool_call>" or the output's end is dropped, before other text it is content.
class ToolCallStream {
 public:
  explicit ToolCallStream(std::string request_id);

  // The events for the next piece of the output, in order; adjacent pieces of one kind are merged.
  std::vector<ToolStreamEvent> Feed(std::string_view delta);
  // What was held back, at the output's end.
  std::vector<ToolStreamEvent> Finish();

  int calls() const { return calls_; }  // calls started so far

 private:
  using Events = std::vector<ToolStreamEvent>;
  bool StepText(bool final, Events* out);
  bool StepBlock(bool final, Events* out);
  void CloseBlock(std::string_view block, bool closed, Events* out);
  void StreamArguments(std::string_view upto, Events* out);
  void StartCall(std::string name, Events* out);

  // What the open block's start is: not known yet, a call's header, or something else.
  enum class Head : uint8_t { kUnknown, kCall, kOther };

  std::string request_id_;
  bool in_block_ = false;
  std::string pending_;  // outside a block: text not yet given (a partial tag, whitespace after a call)
  std::string block_;    // inside a block: its text so far, after "<tool_call>"
  size_t searched_ = 0;  // bytes of block_ searched for "</tool_call>"
  Head head_ = Head::kUnknown;
  size_t args_begin_ = 0;  // kCall: where the arguments start in block_
  size_t args_sent_ = 0;   // kCall: bytes of them given
  bool after_call_ = false;  // a call ended and nothing but whitespace followed yet
  int calls_ = 0;
};

}  // namespace specula
