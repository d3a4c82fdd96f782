#include "tools/serve.h"

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/mapped_file.h"
#include "serving/grpc_frontend.h"
#include "serving/http_frontend.h"
#include "serving/server.h"
#include "core/status_macros.h"
#include "engine/engine_setup.h"
#include "model/weights_hash.h"
#include "request/boundary.h"
#include "tools/engine_flags.h"
#include "tools/kv_store_flags.h"

namespace specula {
namespace {

constexpr char kServeUsage[] = R"(usage: specula serve --model PATH [flags]

Serves one model over gRPC (specula.v1.Generation and Admin, proto/specula/v1/generation.proto, with
grpc.health.v1.Health and reflection) and OpenAI-compatible HTTP (/v1/completions,
/v1/chat/completions, /v1/models, /health, /live, /metrics, POST /reset_prefix_cache, which empties
the local prefix cache, POST /admin/reload), until SIGTERM or SIGINT, which drain: readiness (gRPC
health for "" and specula.v1.Generation, HTTP /health) turns NOT_SERVING (503) while liveness (gRPC
health for the service "liveness", HTTP /live) stays SERVING, new requests get UNAVAILABLE (503),
and requests in flight finish within --drain-timeout-s; then the process exits 0. One line on
stderr says when it is ready.

  --host H              address to listen on (default 127.0.0.1)
  --grpc-port P         gRPC port (default 50051; 0 = any free port, printed when ready)
  --http-port P         HTTP port (default 8000; 0 = any free port; -1 = no HTTP server: gRPC only)
  --served-model-name N the model name in requests and responses (default: --model as given)
  --model-version V     the weights' version, in every response (X-Specula-Model-Version, OpenAI's
                        system_fingerprint, gRPC x-specula-model-version and model_version), in
                        /v1/models and as a label on every metric (default: a hash of the weights)
  --replica-id ID       named by X-Specula-Replica, gRPC x-specula-replica and /metrics (default
                        HOSTNAME:PORT, the --http-port's or under -1 --grpc-port's; port 0: HOSTNAME:pidPID)
  --chat-template PATH  a Jinja file for /v1/chat/completions instead of the model's own template
                        (GGUF tokenizer.chat_template, or tokenizer_config.json's chat_template)
  --max-tokens N        max_tokens of a request that gives none, where its surface's row says
                        so (the table at the end gives each surface's default and bounds)
  --http-threads N      HTTP handler threads, which parse, render and tokenize requests (default 4);
                        connections take no thread, so this bounds no connection count
  --max-request-bytes N largest HTTP request body; a larger one is a 413, never parsed (default 8 MiB)
  --per-request-spec-decode-metrics summary|none
                        with speculation, each response carries its request's acceptance statistics
                        (OpenAI: metrics.speculative_decoding; gRPC: speculative_decoding), as vLLM's
                        flag of that name; default summary (on), none turns them off

Security (the key guards /v1/*, /reset_prefix_cache and specula.v1.Generation; /health, /metrics,
gRPC health and reflection stay open for probes and scrapers: keep them private with the network):
  --api-key KEY         require `Authorization: Bearer KEY` on HTTP and the same `authorization`
                        metadata on gRPC (401 / UNAUTHENTICATED otherwise); default $SPECULA_API_KEY
  --ssl-certfile PEM    TLS on both ports with this certificate chain ...
  --ssl-keyfile PEM     ... and this private key
  --ssl-ca-certs PEM    and require client certificates signed by these CAs

Hot reload (docs/reload.md; needs --api-key, refused with 403 / PERMISSION_DENIED without one):
  POST /admin/reload {"model": PATH} (or gRPC specula.v1.Admin/Reload) loads PATH beside the model
  serving, then switches between two steps: requests admitted before finish on the model they
  started on, which is freed when the last one ends. Optional fields: "tokenizer", "chat_template"
  (empty: the new model's own), "draft_model" (with --spec-method draft; default --draft-model's),
  "model_version" (default: a hash of the new weights). A missing or corrupt file, or a draft or
  chat template for another vocabulary, is a 400 naming the field, and the old model keeps serving.
  Reloads run one at a time. SIGHUP reloads the startup's files. Not under --tensor-parallel-size > 1
  or --device cuda (409 / FAILED_PRECONDITION).

Admission control (refused at once: gRPC RESOURCE_EXHAUSTED, HTTP 429):
  --max-queue-len N     most requests waiting for a slot (default 0 = no limit)
  --max-queue-delay-ms MS  refuse a request whose predicted wait for a slot exceeds MS (default 0 = off)
  --ttft-slo-ms MS      circuit breaker: while the P99 time to first token of the last 10 s is above
                        MS, requests with priority > 0 are refused (lower is more urgent; default off)
  --drain-timeout-s S   how long SIGTERM waits for requests in flight (default 30)

Degrade path (what a request over one of the limits above gets; docs/degrade.md):
  --degrade refuse|faq  refuse (default): the refusal above. faq: a request whose question (a chat's
                        last message when it is the user's, a completion's text prompt, gRPC's prompt)
                        matches a --faq question once normalized is answered from the file at once
                        (X-Specula-Answered-By: faq; "answered_by": "faq" in the body; gRPC
                        answered_by), and any other is refused as before; a request that asks for
                        logprobs or structured output is always refused
  --faq FILE            JSONL, one {"question": "...", "answer": "..."} a line (with --degrade faq)
)";


// The serving flags besides the engine's.
struct ServeFlags {
  std::string host = "127.0.0.1";
  int32_t grpc_port = 50051, http_port = 8000, http_threads = 4;
  int64_t max_request_bytes = int64_t{8} << 20;
  double drain_timeout_s = 30;
  ServeOptions opt;
  SecurityOptions security;
};

// A replica id goes into an HTTP header and a Prometheus label: these characters only.
bool ReplicaIdChar(char c) { return absl::ascii_isalnum(c) || (c != '\0' && std::strchr("._:@/-", c) != nullptr); }

// HOSTNAME:PORT, where the port is the one configured (the HTTP server's, or gRPC's without one);
// HOSTNAME:pidPID where that is 0, since a free port is known only after listening and replicas on
// one host would otherwise share a name. A hostname's odd characters become '-'.
std::string DefaultReplicaId(int32_t port) {
  char name[256] = {};
  std::string host = gethostname(name, sizeof name - 1) == 0 ? name : "";
  for (char& c : host) {
    if (!ReplicaIdChar(c)) c = '-';
  }
  if (host.empty()) host = "specula";
  return port == 0 ? absl::StrCat(host, ":pid", getpid()) : absl::StrCat(host, ":", port);
}

// A flag's value that goes into an HTTP header and a Prometheus label (--replica-id,
// --model-version): 1 to max_len of ReplicaIdChar's characters. `unset` says what leaving the flag
// out gives.
absl::Status CheckLabelValue(const std::string& name, const std::string& v, size_t max_len, const char* unset) {
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty; give a value, or leave it out for ", unset));
  if (v.size() > max_len) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", v.size(), " characters; at most ", max_len));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (ReplicaIdChar(v[i])) continue;
    const std::string c = v[i] == ' ' ? "' ' (a space)" : absl::StrCat("'", absl::CHexEscape(v.substr(i, 1)), "'");
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", absl::CHexEscape(v), "' has ", c, " at position ",
                                                   i + 1, "; use only letters, digits and . _ : @ / -"));
  }
  return absl::OkStatus();
}

// The version given (--model-version, or a reload's model_version; `name` says which), or a hash of
// the weights: the one the shared KV store salts with, cached by the files' identity
// (model/weights_hash.h).
absl::StatusOr<std::string> ModelVersion(const std::string& name, const std::string& given, const std::string& model) {
  if (given.empty()) {
    absl::StatusOr<std::string> hash = WeightsHash(model, DefaultWeightsHashCacheDir());
    if (!hash.ok()) return absl::Status(hash.status().code(), absl::StrCat(name, ": ", hash.status().message()));
    return hash;
  }
  RETURN_IF_ERROR(CheckLabelValue(name, given, 128, "a hash of the weights"));
  return given;
}

absl::StatusOr<std::string> ReadReplicaId(const Flags& flags, const ServeFlags& f) {
  const auto it = flags.values.find("replica-id");
  if (it == flags.values.end()) return DefaultReplicaId(f.http_port != -1 ? f.http_port : f.grpc_port);
  RETURN_IF_ERROR(CheckLabelValue("--replica-id", it->second, std::string::npos, "HOSTNAME:PORT"));
  return it->second;
}

// --degrade and --faq: the FAQ file is read and checked here, so that a bad one fails at startup.
absl::Status ReadDegradeFlags(const Flags& flags, ServeOptions* opt) {
  const auto degrade = flags.values.find("degrade");
  const auto faq = flags.values.find("faq");
  const std::string mode = degrade == flags.values.end() ? "refuse" : degrade->second;
  if (mode == "draft") {
    return absl::InvalidArgumentError("--degrade draft: not offered (the draft model answering alone); use faq or refuse");
  }
  if (mode != "refuse" && mode != "faq") {
    return absl::InvalidArgumentError(absl::StrCat("--degrade: '", mode, "' is not refuse or faq"));
  }
  if (mode == "refuse") {
    if (faq != flags.values.end()) return absl::InvalidArgumentError("--faq: needs --degrade faq, which answers from it");
    return absl::OkStatus();
  }
  if (faq == flags.values.end()) return absl::InvalidArgumentError("--degrade faq: needs --faq FILE, the answers");
  ASSIGN_OR_RETURN(FaqTable table, FaqTable::Load(faq->second));
  opt->faq = std::make_shared<const FaqTable>(std::move(table));
  return absl::OkStatus();
}

absl::StatusOr<ServeFlags> ReadServeFlags(const Flags& flags) {
  ServeFlags f;
  ServeOptions& opt = f.opt;
  for (auto st : {GetNumber(flags, "grpc-port", &f.grpc_port), GetNumber(flags, "http-port", &f.http_port),
                  GetNumber(flags, "http-threads", &f.http_threads),
                  GetNumber(flags, "max-request-bytes", &f.max_request_bytes),
                  GetNumber(flags, "max-queue-len", &opt.admission.max_queue_len),
                  GetNumber(flags, "max-queue-delay-ms", &opt.admission.max_queue_delay_ms),
                  GetNumber(flags, "ttft-slo-ms", &opt.admission.ttft_slo_ms),
                  GetNumber(flags, "drain-timeout-s", &f.drain_timeout_s)}) {
    if (!st.ok()) return st;
  }
  if (f.grpc_port < 0 || f.grpc_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc-port: ", f.grpc_port, " is not a port"));
  }
  if (f.http_port < -1 || f.http_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http-port: ", f.http_port, " is not a port (or -1: no HTTP server)"));
  }
  if (f.http_threads < 1) return absl::InvalidArgumentError(absl::StrCat("--http-threads must be >= 1, got ", f.http_threads));
  if (f.max_request_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-request-bytes must be >= 1, got ", f.max_request_bytes));
  }
  if (opt.admission.max_queue_len < 0 || opt.admission.max_queue_delay_ms < 0 || opt.admission.ttft_slo_ms < 0 ||
      f.drain_timeout_s < 0) {
    return absl::InvalidArgumentError("--max-queue-len, --max-queue-delay-ms, --ttft-slo-ms and --drain-timeout-s must be >= 0");
  }
  if (auto it = flags.values.find("host"); it != flags.values.end()) f.host = it->second;
  if (const char* env = std::getenv("SPECULA_API_KEY"); env != nullptr) f.security.api_key = env;
  for (auto [flag, dst] : {std::pair<const char*, std::string*>{"api-key", &f.security.api_key},
                           {"ssl-certfile", &f.security.ssl_certfile}, {"ssl-keyfile", &f.security.ssl_keyfile},
                           {"ssl-ca-certs", &f.security.ssl_ca_certs}}) {
    if (auto it = flags.values.find(flag); it != flags.values.end()) *dst = it->second;
  }
  if (flags.values.count("api-key") && f.security.api_key.empty()) {
    return absl::InvalidArgumentError("--api-key: empty; give a key, or leave the flag out for none");
  }
  RETURN_IF_ERROR(ValidateSecurityOptions(f.security));
  if (auto it = flags.values.find("per-request-spec-decode-metrics"); it != flags.values.end()) {
    if (it->second != "summary" && it->second != "none") {
      return absl::InvalidArgumentError(absl::StrCat("--per-request-spec-decode-metrics: '", it->second,
                                                     "' is not summary or none (per-step arrays are not kept)"));
    }
    opt.spec_metrics = it->second == "summary";
  }
  ASSIGN_OR_RETURN(opt.replica_id, ReadReplicaId(flags, f));
  RETURN_IF_ERROR(ReadDegradeFlags(flags, &opt));
  return f;
}

// What the served model is loaded from: the startup's flags; a reload changes the paths it names.
struct ModelSource {
  EngineOptions options;                  // as the flags gave them
  std::optional<KvStoreOptions> kv_store;  // --kv-store: each engine gets its own connection
  ReloadSpec spec;                        // the startup's own: what SIGHUP reloads
};

// Keeps a bundle's engine and what it was loaded from; the engine goes first.
struct OwnedModel {
  std::unique_ptr<LoadedEngine> loaded;
  std::unique_ptr<Engine> engine;
};

// The bundle over a loaded engine: its engine (with --kv-store attached), version, chat template.
absl::StatusOr<ModelBundle> MakeBundle(std::unique_ptr<LoadedEngine> loaded, const ModelSource& src,
                                       const ReloadSpec& spec, const std::string& version_name) {
  LoadedEngine& e = *loaded;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeEngine(e));
  if (src.kv_store.has_value()) RETURN_IF_ERROR(AttachKvStore(e, *src.kv_store, engine.get()));
  ModelBundle b;
  ASSIGN_OR_RETURN(b.version, ModelVersion(version_name, spec.model_version, spec.model));
  b.engine = engine.get();
  b.tokenizer = e.tokenizer.get();
  b.model = &e.model->config();
  b.add_bos = e.add_bos;
  b.spec_method = e.options.speculation.method;
  b.num_spec_tokens = e.proposer == nullptr ? "0" : e.adaptive() ? "auto" : absl::StrCat(e.num_spec());
  b.source = spec.model;
  SetChat(FindChatTemplate(spec.model, spec.chat_template), &b);
  b.owner = std::make_shared<OwnedModel>(OwnedModel{std::move(loaded), std::move(engine)});
  return b;
}

// A reload's bundle: the startup's engine flags with the paths `spec` names (empty: the new model's
// own tokenizer and template; the startup's draft). Errors name the request's field.
absl::StatusOr<ModelBundle> LoadForReload(const ModelSource& src, const ReloadSpec& spec) {
  const TargetOptions& t = src.options.target;
  if (t.tensor_parallel_size > 1) {
    return absl::FailedPreconditionError(absl::StrCat("reload: not offered under --tensor-parallel-size ",
                                                      t.tensor_parallel_size, " (restart the ranks instead)"));
  }
  if (t.device != "cpu") {
    return absl::FailedPreconditionError(absl::StrCat("reload: not offered on --device ", t.device, " yet"));
  }
  EngineOptions o = src.options;
  const bool draft = o.speculation.method == "draft";
  if (!spec.draft_model.empty() && !draft) {
    return absl::InvalidArgumentError(absl::StrCat("draft_model: the server runs --spec-method ", o.speculation.method,
                                                   ", which has no draft model"));
  }
  for (auto [field, path] : {std::pair<const char*, const std::string*>{"model", &spec.model}, {"tokenizer", &spec.tokenizer},
                             {"chat_template", &spec.chat_template}, {"draft_model", &spec.draft_model}}) {
    if (!path->empty() && access(path->c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", *path, ": ", std::strerror(errno)));
    }
  }
  o.target.model = spec.model;
  o.target.tokenizer = spec.tokenizer;
  if (!spec.draft_model.empty()) o.speculation.draft_model = spec.draft_model;
  absl::StatusOr<std::unique_ptr<LoadedEngine>> loaded = LoadEngine(o);
  if (!loaded.ok()) {
    const std::string m(loaded.status().message());
    const bool of_draft = draft && absl::StartsWith(m, o.speculation.draft_model);
    return absl::InvalidArgumentError(absl::StrCat(of_draft ? "draft_model: " : "model: ", m));
  }
  absl::StatusOr<ModelBundle> b = MakeBundle(*std::move(loaded), src, spec, "model_version");
  if (!b.ok()) return b.status();
  if (!spec.chat_template.empty() && !b->chat_source.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", b->chat_source.status().message()));
  }
  return b;
}

// Waits for SIGTERM or SIGINT, then drains: new requests refused, those in flight given up to
// drain_timeout_s, the rest aborted. SIGHUP reloads the startup's model (its files, re-read) on a
// thread of its own, so that a drain is never held up by a load. `http` is null under --http-port -1.
void ServeUntilSignal(const sigset_t& signals, double drain_timeout_s, const ReloadSpec& startup, Server& server,
                      GrpcFrontend& grpc, HttpFrontend* http) {
  int sig = 0;
  std::vector<std::thread> reloads;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    std::fprintf(stderr, "[specula] SIGHUP: reloading %s\n", startup.model.c_str());
    reloads.emplace_back([&server, startup] { server.Reload(startup).IgnoreError(); });  // Reload logs the outcome
  }
  std::fprintf(stderr, "[specula] %s: draining %lld requests in flight (up to %.0f s)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", static_cast<long long>(server.in_flight()), drain_timeout_s);
  server.StartDrain();
  grpc.SetServing(false);
  const bool idle = server.WaitIdle(std::chrono::milliseconds(static_cast<int64_t>(drain_timeout_s * 1000)));
  if (!idle) {
    std::fprintf(stderr, "[specula] drain timeout: aborting %lld requests\n", static_cast<long long>(server.in_flight()));
    server.CancelAll();
    server.WaitIdle(std::chrono::milliseconds(5000));
  }
  // The engine loop still runs here, so calls still open end with their aborted last delta.
  grpc.Shutdown(std::chrono::milliseconds(1000));
  if (http != nullptr) http->Stop();
  for (std::thread& t : reloads) t.join();  // a load still running finishes (its switch changes nothing now)
  std::fprintf(stderr, "[specula] drained; exiting\n");
}

}  // namespace

absl::Status RunServe(int argc, char** argv) {
  std::set<std::string> known = kEngineFlags;
  known.insert({"host", "grpc-port", "http-port", "replica-id", "model-version", "served-model-name", "chat-template", "http-threads", "max-request-bytes", "max-queue-len",
                "max-queue-delay-ms", "ttft-slo-ms", "drain-timeout-s", "api-key", "ssl-certfile", "ssl-keyfile",
                "ssl-ca-certs", "per-request-spec-decode-metrics", "degrade", "faq"});
  known.insert(kKvStoreFlags.begin(), kKvStoreFlags.end());
  std::set<std::string> switches = kEngineSwitches;
  switches.insert("help");
  ASSIGN_OR_RETURN(Flags flags, ParseFlags(argc, argv, known, switches));
  if (flags.switches.count("help")) {
    std::cout << kServeUsage << kKvStoreFlagsHelp << "\nEngine flags, as for generate:\n" << kEngineFlagsHelp << kRequestTableHelp << SurfaceTableMarkdown();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ServeFlags f, ReadServeFlags(flags));
  ASSIGN_OR_RETURN(std::optional<KvStoreOptions> kv_store, ReadKvStoreFlags(flags));
  ASSIGN_OR_RETURN(EngineOptions options, EngineOptionsFromFlags(flags));
  // SIGTERM, SIGINT and SIGHUP are taken by sigwait: blocked here, before any thread starts, so that
  // every thread inherits the mask and none is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Buffers of 1 MiB and more (weights, KV pools, scratch) are mapped on their own and unmapped when
  // freed. glibc's default raises that threshold after the first such free, which after a reload
  // leaves the new model's buffers on the heap, held beyond a fresh server's size (docs/reload.md).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ModelSource src{options, kv_store, {}};
  src.spec = {options.target.model, options.target.tokenizer,
              flags.values.count("chat-template") ? flags.values["chat-template"] : "",
              options.speculation.draft_model, flags.values.count("model-version") ? flags.values["model-version"] : ""};
  if (flags.values.count("model-version")) {
    RETURN_IF_ERROR(CheckLabelValue("--model-version", src.spec.model_version, 128, "a hash of the weights"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedEngine> loaded, LoadEngine(options));
  if (loaded->follower) return absl::OkStatus();  // a tensor-parallel rank other than 0: only rank 0 serves
  ASSIGN_OR_RETURN(ModelBundle bundle, MakeBundle(std::move(loaded), src, src.spec, "--model-version"));

  ServeOptions& opt = f.opt;
  opt.model_name = flags.values.count("served-model-name") ? flags.values["served-model-name"] : options.target.model;
  opt.default_max_tokens = options.defaults.max_tokens;
  opt.kv_store = kv_store.has_value();
  Server server(std::move(bundle), opt, [&src](const ReloadSpec& spec) { return LoadForReload(src, spec); });
  // Copies: holding the bundle here would keep it after a reload.
  const SchedulerConfig sc = server.Current()->scheduler;
  const std::string version = server.Current()->version;
  ASSIGN_OR_RETURN(auto grpc, GrpcFrontend::Start(&server, f.host, f.grpc_port, f.security));
  std::unique_ptr<HttpFrontend> http;
  std::string http_where = "off";
  if (f.http_port != -1) {
    const HttpOptions http_options{f.host, f.http_port, f.http_threads, static_cast<size_t>(f.max_request_bytes),
                                   f.security};
    ASSIGN_OR_RETURN(http, HttpFrontend::Start(&server, http_options));
    http_where = absl::StrCat(f.host, ":", http->port());
  }
  std::fprintf(stderr,
               "[specula] serving %s version %s on grpc %s:%d and http %s (max %d sequences, %d KV blocks, replica %s%s): ready\n",
               opt.model_name.c_str(), version.c_str(), f.host.c_str(), grpc->port(), http_where.c_str(), sc.max_num_seqs,
               sc.num_blocks, opt.replica_id.c_str(),
               opt.faq != nullptr ? absl::StrCat(", degrade faq: ", opt.faq->size(), " answers").c_str() : "");
  ServeUntilSignal(signals, f.drain_timeout_s, src.spec, server, *grpc, http.get());
  return absl::OkStatus();
}

}  // namespace specula
