// specula: the command-line front end. Subcommands, like git:
//   specula generate    --model PATH --prompt TEXT ...
//   specula serve       --model PATH ...     (tools/serve.cc)
//   specula bench-serve --endpoint URL ...   (tools/bench_serve.cc)
//   specula experiment run SPEC --out DIR | report DIR   (tools/experiment.cc)
//   specula make-model  --shape NAME|--config config.json --out DIR ...

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/beside_executable.h"
#include "core/mapped_file.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "core/status_macros.h"
#include "model/chat.h"
#include "model/make_model.h"
#include "model/tokenizer.h"
#include "tools/batch_generate.h"
#include "engine/engine_setup.h"
#include "core/flags.h"
#include "tools/command_exit.h"

namespace specula {
namespace {

constexpr char kUsage[] = R"(specula: a speculative-decoding research and serving engine

usage: specula <command> [flags]

commands:
  generate     generate text from a model
  serve        serve a model over gRPC and OpenAI-compatible HTTP, with metrics and admission control
  bench-serve  load-test a running server (gRPC or HTTP): latency percentiles, throughput, goodput
  experiment   run an experiment spec (a sweep of batching and speculation) and report it
  make-model   write a random-weight HF model of a named real shape
  help         show this message

Run 'specula <command> --help' for a command's flags.
)";

constexpr char kGenerateUsage[] = R"(usage: specula generate --model PATH --prompt TEXT [flags]

Writes only the new text to stdout, as it is produced. Statistics go to stderr.

  --prompt TEXT         the prompt
  --prompt-file PATH    read the prompt from a file instead
  --chat                apply the model's chat template to --prompt (a user message), as
                        `/v1/chat/completions` does; the template comes from the GGUF file
                        (tokenizer.chat_template) or the HF directory (tokenizer_config.json)
  --system TEXT         with --chat: a system message before the prompt
  --messages PATH       a conversation instead of --prompt: a JSON array of {"role", "content"},
                        rendered with the chat template (implies --chat)
  --chat-template PATH  a Jinja file to use instead of the model's template
  --prompts-file PATH   batch mode (continuous batching over a paged KV cache): JSON lines
                        {"id":..., "prompt":..., "max_tokens":..., "temperature":...}
                        (optional: top_p, top_k, min_p, repetition_penalty, seed, stop). Writes one
                        JSON line per request: id, text, token_ids, finish_reason, ttft_ms, tpot_ms.
                        A malformed line gets an error naming its line and field; the others run.
  --no-progress         no progress bar on stderr (batch mode)
)";

constexpr char kMakeModelUsage[] = R"(usage: specula make-model (--shape NAME | --config config.json) --out DIR [flags]

Writes an HF directory (config.json, model.safetensors, tokenizer.json) with random weights of a
real model's shape, for speed work without downloads.

  --shape NAME     one of: %s
  --config PATH    an HF config.json to take the shape from instead
  --out DIR        output directory (created if missing)
  --vocab N        override the vocabulary size
  --dtype D        f32, f16 or bf16 (default f32)
  --seed S         random seed (default 0)
)";

// One prompt through the engine with speculation, streaming each step's new text.
absl::Status RunSpeculativeSingle(LlamaModel& model, const Tokenizer& tok, const std::vector<TokenId>& prompt,
                                  const GenerateOptions& opt, Proposer* proposer, int32_t num_spec, bool adaptive) {
  SchedulerConfig sc;
  sc.max_num_seqs = 1;
  sc.block_size = opt.block_size;
  sc.max_model_len = model.config().max_seq_len;
  sc.num_blocks = (sc.max_model_len + sc.block_size - 1) / sc.block_size + 1;
  sc.max_num_batched_tokens = std::max(2048, num_spec + 1);
  sc.num_spec_tokens = num_spec;
  SpecConfig spec;
  spec.proposer = proposer;
  spec.adaptive = adaptive;
  Engine engine(&model, &tok, sc, spec);
  if (auto st = engine.Validate(); !st.ok()) return st;
  Request r;
  r.id = 0;
  r.prompt = prompt;
  r.max_tokens = std::max(1, std::min<int32_t>(opt.max_tokens, sc.max_model_len - static_cast<int32_t>(prompt.size())));
  r.sampling = opt.sampling;
  r.stop_ids = opt.stop_ids;
  r.ignore_eos = true;  // stop ids are explicit here
  if (auto st = engine.AddRequest(r); !st.ok()) return st;
  size_t printed = 0;
  RequestOutput final_out;
  while (engine.HasUnfinished()) {
    for (auto& o : engine.Step()) final_out = std::move(o);
    if (const RequestOutput* p = engine.Peek(0); p != nullptr && p->text.size() > printed) {
      std::fwrite(p->text.data() + printed, 1, p->text.size() - printed, stdout);
      std::fflush(stdout);
      printed = p->text.size();
    }
  }
  if (final_out.text.size() > printed) std::fwrite(final_out.text.data() + printed, 1, final_out.text.size() - printed, stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double decode_ms = final_out.token_ms.empty() ? 0 : final_out.finish_ms - final_out.first_token_ms;
  std::fprintf(stderr, "[specula] prompt tokens: %d, generated tokens: %zu\n[specula] ttft: %.1f ms, decode: %.1f tokens/s\n",
               final_out.prompt_tokens, final_out.tokens.size(), final_out.ttft_ms(),
               final_out.tokens.size() > 1 ? (final_out.tokens.size() - 1) / (decode_ms / 1000) : 0.0);
  std::fputs(SpecStatsLine(final_out.spec).c_str(), stderr);
  std::fputs(SpecLengthLine(engine.stats()).c_str(), stderr);
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

absl::Status RunGenerate(int argc, char** argv) {
  std::set<std::string> known = kEngineFlags, switches = kEngineSwitches;
  known.insert({"prompt", "prompt-file", "prompts-file", "messages", "system", "chat-template"});
  switches.insert({"help", "no-progress", "chat"});
  auto flags = ParseFlags(argc, argv, known, switches);
  if (!flags.ok()) return flags.status();
  if (flags->switches.count("help")) {
    std::cout << kGenerateUsage << "\n" << kEngineFlagsHelp;
    return absl::OkStatus();
  }
  if (!flags->values.count("model")) return absl::InvalidArgumentError("--model is required");
  if (flags->values.count("prompt") + flags->values.count("prompt-file") + flags->values.count("prompts-file") +
          flags->values.count("messages") != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt TEXT, --prompt-file PATH, --messages PATH or --prompts-file PATH");
  }
  const bool chat = flags->switches.count("chat") || flags->values.count("messages");
  if (chat && flags->values.count("prompts-file")) {
    return absl::InvalidArgumentError("--chat applies to --prompt or --messages, not to --prompts-file");
  }
  if (!chat && (flags->values.count("system") || flags->values.count("chat-template"))) {
    return absl::InvalidArgumentError("--system and --chat-template need --chat or --messages");
  }
  if (flags->values.count("prompt-file")) {
    auto text = ReadTextFile(flags->values["prompt-file"]);
    if (!text.ok()) return text.status();
    flags->values["prompt"] = *text;
  }
  auto loaded = LoadEngine(*flags);
  if (!loaded.ok()) return loaded.status();
  if ((*loaded)->follower) return absl::OkStatus();  // a tensor-parallel rank other than 0: done
  LoadedEngine& e = **loaded;
  LlamaModel& model = *e.model;
  const Tokenizer& tok = *e.tokenizer;
  GenerateOptions opt = e.opt;

  if (flags->values.count("prompts-file")) {
    BatchOptions b;
    b.prompts_file = flags->values["prompts-file"];
    b.sampling = opt.sampling;
    b.max_tokens = opt.max_tokens;
    b.add_bos = e.add_bos;
    b.ignore_eos = e.ignore_eos;
    b.progress = !flags->switches.count("no-progress");
    auto sc = BatchSchedulerConfig(*flags, e);
    if (!sc.ok()) return sc.status();
    b.scheduler = *sc;
    b.proposer = e.proposer.get();
    b.adaptive_spec = e.adaptive;
    return RunBatchGenerate(model, tok, b, stdout);
  }
  std::vector<TokenId> prompt;
  if (chat) {
    auto text = ChatPrompt(*flags);
    if (!text.ok()) return text.status();
    prompt = tok.Encode(*text, /*add_bos=*/false);  // the template writes BOS where the model wants it
  } else {
    prompt = tok.Encode(flags->values["prompt"], e.add_bos);
  }
  if (!e.ignore_eos) {
    opt.stop_ids = tok.eos_ids();
    for (TokenId id : model.config().eos_token_ids) opt.stop_ids.push_back(id);
    // llama2.c models mark the end of a story with BOS.
    if (model.config().rope_interleaved && tok.bos_id() >= 0) opt.stop_ids.push_back(tok.bos_id());
  }
  if (e.proposer != nullptr) {
    return RunSpeculativeSingle(model, tok, prompt, opt, e.proposer.get(), e.num_spec, e.adaptive);
  }
  TokenId prev = prompt.empty() ? -1 : prompt.back();
  auto result = Generate(model, prompt, opt, [&](TokenId t) {
    const std::string piece = tok.DecodeToken(prev, t);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    prev = t;
  });
  if (!result.ok()) return result.status();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const int32_t n = static_cast<int32_t>(result->tokens.size());
  std::fprintf(stderr,
               "[specula] prompt tokens: %d, generated tokens: %d\n"
               "[specula] prefill: %.1f tokens/s (%.1f ms), decode: %.1f tokens/s (%.1f ms)\n",
               result->prompt_tokens, n, result->prompt_tokens / std::max(result->prefill_seconds, 1e-9),
               result->prefill_seconds * 1e3, std::max(n - 1, 0) / std::max(result->decode_seconds, 1e-9),
               result->decode_seconds * 1e3);
  return absl::OkStatus();
}

absl::Status RunMakeModel(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv, {"shape", "config", "out", "vocab", "dtype", "seed"}, {"help"});
  if (!flags.ok()) return flags.status();
  if (flags->switches.count("help")) {
    std::cout << absl::StrFormat(kMakeModelUsage, absl::StrJoin(NamedShapes(), ", "));
    return absl::OkStatus();
  }
  if (flags->values.count("shape") == flags->values.count("config")) {
    return absl::InvalidArgumentError("give exactly one of --shape NAME or --config config.json");
  }
  if (!flags->values.count("out")) return absl::InvalidArgumentError("--out is required");
  absl::StatusOr<ModelConfig> config;
  if (flags->values.count("shape")) {
    config = NamedShape(flags->values["shape"]);
  } else {
    auto text = ReadTextFile(flags->values["config"]);
    if (!text.ok()) return text.status();
    config = ParseHfConfig(*text, flags->values["config"]);
  }
  if (!config.ok()) return config.status();
  int64_t seed = 0;
  for (auto st : {GetNumber(*flags, "vocab", &config->vocab_size), GetNumber(*flags, "seed", &seed)}) {
    if (!st.ok()) return st;
  }
  DType dtype = DType::kF32;
  if (flags->values.count("dtype")) {
    const std::string d = flags->values["dtype"];
    if (d == "f32") dtype = DType::kF32;
    else if (d == "f16") dtype = DType::kF16;
    else if (d == "bf16") dtype = DType::kBF16;
    else return absl::InvalidArgumentError(absl::StrCat("--dtype: '", d, "' is not f32, f16 or bf16"));
  }
  const std::string out = flags->values["out"];
  std::fprintf(stderr, "[specula] writing %.1fM parameters (%s) to %s\n",
               config->NumParams() / 1e6, flags->values.count("dtype") ? flags->values["dtype"].c_str() : "f32",
               out.c_str());
  if (auto st = WriteRandomModel(*config, out, dtype, static_cast<uint64_t>(seed)); !st.ok()) return st;
  std::fprintf(stderr, "[specula] done\n");
  return absl::OkStatus();
}

// serve, bench-serve and experiment: libspecula_cli.so (tools/cli_module.cc), beside this binary
// or where the build wrote it, so that `generate` does not load their gRPC and Protobuf libraries.
int RunCliModule(int argc, char** argv) {
  std::string path = SPECULA_CLI_MODULE;
  if (const std::string beside = BesideExecutable("libspecula_cli.so");
      !beside.empty() && ::access(beside.c_str(), F_OK) == 0) {
    path = beside;
  }
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  using Main = int (*)(int, char**);
  Main run = h != nullptr ? reinterpret_cast<Main>(::dlsym(h, "specula_cli_main")) : nullptr;
  if (run == nullptr) {
    const char* why = ::dlerror();
    std::cerr << "specula " << argv[1] << ": error: cannot load " << path << ": "
              << (why != nullptr ? why : "no specula_cli_main") << "\n";
    return 1;
  }
  return run(argc, argv);
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    std::cout << specula::kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "serve" || cmd == "bench-serve" || cmd == "experiment") return specula::RunCliModule(argc, argv);
  absl::Status st;
  if (cmd == "generate") {
    st = specula::RunGenerate(argc - 2, argv + 2);
  } else if (cmd == "make-model") {
    st = specula::RunMakeModel(argc - 2, argv + 2);
  } else {
    std::cerr << "specula: unknown command '" << cmd << "'\n\n" << specula::kUsage;
    return 1;
  }
  return specula::FinishCommand(cmd, st);
}
