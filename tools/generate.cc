// `specula generate`: one prompt (streamed, or one JSON line with --json) or a prompts file
// (tools/batch_generate.h), through the engine's one step loop and output path.
#include "tools/generate.h"

#include <cstdio>
#include <iostream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "chat/chat.h"
#include "core/flags.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "engine/run.h"
#include "request/boundary.h"
#include "request/finish.h"
#include "tools/batch_generate.h"
#include "tools/engine_flags.h"

namespace specula {
namespace {

constexpr char kGenerateUsage[] = R"(usage: specula generate --model PATH --prompt TEXT [flags]

Writes only the new text to stdout, as it is produced. Statistics go to stderr.

  --prompt TEXT         the prompt
  --prompt-file PATH    read the prompt from a file instead
  --chat                apply the model's chat template to --prompt (a user message), or to each
                        --prompts-file line's prompt, as `/v1/chat/completions` does; the template
                        comes from the GGUF file (tokenizer.chat_template) or the HF directory
                        (tokenizer_config.json)
  --system TEXT         with --chat: a system message before the prompt (each prompt)
  --messages PATH       a conversation instead of --prompt: a JSON array of {"role", "content"},
                        rendered with the chat template (implies --chat)
  --chat-template PATH  a Jinja file to use instead of the model's template
  --prompts-file PATH   batch mode (continuous batching over a paged KV cache): JSON lines
                        {"id":..., "prompt":..., "max_tokens":..., "temperature":...}
                        (optional: top_p, top_k, min_p, repetition_penalty, seed, stop). Writes one
                        JSON line per request: id, text, token_ids, finish_reason, ttft_ms, tpot_ms;
                        with speculation also metrics.speculative_decoding (the OpenAI responses'
                        acceptance statistics). A malformed line gets an error naming its line and
                        field; the others run.
  --json                with --prompt, --prompt-file or --messages: write the result as one JSON line
                        (the fields of a --prompts-file line) instead of streaming the text
  --no-progress         no progress bar on stderr (batch mode)
)";

absl::Status CheckGenerateFlags(Flags& flags) {
  if (!flags.values.count("model")) return absl::InvalidArgumentError("--model is required");
  if (flags.values.count("prompt") + flags.values.count("prompt-file") + flags.values.count("prompts-file") +
          flags.values.count("messages") != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt TEXT, --prompt-file PATH, --messages PATH or --prompts-file PATH");
  }
  const bool chat = flags.switches.count("chat") || flags.values.count("messages");
  if (!chat && (flags.values.count("system") || flags.values.count("chat-template"))) {
    return absl::InvalidArgumentError("--system and --chat-template need --chat or --messages");
  }
  if (flags.switches.count("json") && flags.values.count("prompts-file")) {
    return absl::InvalidArgumentError("--json applies to a single prompt; --prompts-file always writes JSON lines");
  }
  return absl::OkStatus();
}

// The prompt text of a chat: --messages FILE, or --system and --prompt as messages, through the
// model's chat template (or --chat-template).
absl::StatusOr<std::string> ChatPrompt(Flags& flags) {
  std::vector<ChatMessage> messages;
  if (flags.values.count("messages")) {
    const std::string path = flags.values["messages"];
    ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
    ASSIGN_OR_RETURN(messages, ParseMessagesJson(text, path));
  } else {
    if (flags.values.count("system")) messages.push_back({"system", flags.values["system"]});
    messages.push_back({"user", flags.values["prompt"]});
  }
  ASSIGN_OR_RETURN(ChatSource source, FindChatTemplate(flags.values["model"], flags.values.count("chat-template")
                                                                                  ? flags.values["chat-template"]
                                                                                  : ""));
  return RenderChat(source, messages);
}

void PrintStats(const RequestOutput& out) {
  const size_t n = out.tokens.size();
  const double decode_ms = n > 1 ? out.token_ms.back() - out.token_ms.front() : 0.0;
  std::fprintf(stderr,
               "[specula] prompt tokens: %d, generated tokens: %zu, finish: %s\n"
               "[specula] prefill: %.1f tokens/s (%.1f ms), decode: %.1f tokens/s (%.1f ms)\n",
               out.prompt_tokens, n, FinishName(out.finish), out.prompt_tokens / std::max(out.ttft_ms(), 1e-6) * 1e3,
               out.ttft_ms(), n > 1 ? (n - 1) / std::max(decode_ms, 1e-6) * 1e3 : 0.0, decode_ms);
}

}  // namespace

absl::Status RunSinglePrompt(LoadedEngine& e, const std::string& text, bool templated, bool json) {
  RequestSpec spec = SpecDefaults(Surface::kOnePrompt, e.defaults().sampling);
  spec.ignore_eos = e.ignore_eos();
  PromptInput input;
  input.text = text;
  input.templated = templated;
  ASSIGN_OR_RETURN(std::vector<TokenId> prompt, NormalizeRequest(Surface::kOnePrompt, RequestContextOf(e), input, &spec));
  EngineVariant one;
  one.scheduler = SinglePromptSchedulerConfig(e, prompt.size(), spec.max_tokens);
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, one));
  Engine& engine = *made;
  RETURN_IF_ERROR(engine.AddRequest(MakeRequest(0, std::move(prompt), std::move(spec))));
  RunCallbacks stream;
  if (!json) {
    stream.on_delta = [](const RequestDelta& d) {
      std::fwrite(d.text.data(), 1, d.text.size(), stdout);
      std::fflush(stdout);
    };
  }
  ASSIGN_OR_RETURN(std::vector<RequestOutput> finished, RunToCompletion(engine, stream));
  const RequestOutput& out = finished.at(0);
  if (!out.error.empty()) return absl::InternalError(out.error);
  if (json) {
    WriteJsonLine(stdout, OutputJson(0, out, e.num_spec()));
  } else {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  PrintStats(out);
  if (e.proposer != nullptr) {
    std::fputs(SpecStatsLine(out.spec).c_str(), stderr);
    std::fputs(SpecLengthLine(engine.stats()).c_str(), stderr);
  }
  return absl::OkStatus();
}

absl::Status RunGenerate(int argc, char** argv) {
  std::set<std::string> known = kEngineFlags, switches = kEngineSwitches;
  known.insert({"prompt", "prompt-file", "prompts-file", "messages", "system", "chat-template"});
  switches.insert({"help", "no-progress", "chat", "json"});
  auto flags = ParseFlags(argc, argv, known, switches);
  if (!flags.ok()) return flags.status();
  if (flags->switches.count("help")) {
    std::cout << kGenerateUsage << "\n" << kEngineFlagsHelp << kRequestTableHelp << SurfaceTableMarkdown();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckGenerateFlags(*flags));
  if (flags->values.count("prompt-file")) {
    ASSIGN_OR_RETURN(flags->values["prompt"], ReadTextFile(flags->values["prompt-file"]));
  }
  ASSIGN_OR_RETURN(EngineOptions options, EngineOptionsFromFlags(*flags));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedEngine> e, LoadEngine(options));
  if (e->follower) return absl::OkStatus();  // a tensor-parallel rank other than 0: done
  if (flags->values.count("prompts-file")) {
    BatchOptions b;
    b.prompts_file = flags->values["prompts-file"];
    b.progress = !flags->switches.count("no-progress");
    if (flags->switches.count("chat")) {
      ASSIGN_OR_RETURN(ChatSource source, FindChatTemplate(flags->values["model"], flags->values.count("chat-template")
                                                                                      ? flags->values["chat-template"]
                                                                                      : ""));
      const std::string system = flags->values.count("system") ? flags->values["system"] : "";
      b.chat = [source, system](const std::string& prompt) -> absl::StatusOr<std::string> {
        std::vector<ChatMessage> messages;
        if (!system.empty()) messages.push_back({"system", system});
        messages.push_back({"user", prompt});
        return RenderChat(source, messages);
      };
    }
    return RunBatchGenerate(*e, b, stdout);
  }
  const bool json = flags->switches.count("json") > 0;
  if (flags->switches.count("chat") || flags->values.count("messages")) {
    ASSIGN_OR_RETURN(std::string text, ChatPrompt(*flags));
    return RunSinglePrompt(*e, text, /*templated=*/true, json);  // the template writes BOS where the model wants it
  }
  return RunSinglePrompt(*e, flags->values["prompt"], /*templated=*/false, json);
}

}  // namespace specula
