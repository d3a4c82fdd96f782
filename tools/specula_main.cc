// specula: the command-line front end. Subcommands, like git:
//   specula generate    --model PATH --prompt TEXT ...
//   specula serve       --model PATH ...     (tools/serve.cc)
//   specula bench-serve --endpoint URL ...   (tools/bench_serve.cc)
//   specula experiment run SPEC --out DIR | report DIR   (tools/experiment.cc)
//   specula make-model  --shape NAME|--config config.json --out DIR ...
//   specula simulate    --cost FILE | --device NAME --shape NAME ...   (tools/simulate.cc)
//   specula plan        --qps LIST --candidates FILE ...                (tools/plan.cc)

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
#include "core/flags.h"
#include "model/make_model.h"
#include "model/model_config.h"
#include "tools/command_exit.h"
#include "tools/generate.h"
#include "tools/plan.h"
#include "tools/simulate.h"

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
  simulate     simulate serving replicas (the real scheduler and speculation on modelled step times)
  plan         the cheapest fleet that meets latency SLOs at a target load, from simulations
  help         show this message

Run 'specula <command> --help' for a command's flags.
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
  } else if (cmd == "plan") {
    st = specula::RunPlan(argc - 2, argv + 2);
  } else if (cmd == "simulate") {
    st = specula::RunSimulate(argc - 2, argv + 2);
  } else if (cmd == "make-model") {
    st = specula::RunMakeModel(argc - 2, argv + 2);
  } else {
    std::cerr << "specula: unknown command '" << cmd << "'\n\n" << specula::kUsage;
    return 1;
  }
  return specula::FinishCommand(cmd, st);
}
