#include "serving/grpc_frontend.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <utility>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "request/boundary.h"
#include "request/finish.h"
#include "grpc/health/v1/health.pb.h"
#include "serving/spec_metrics.h"
#include "serving/tls_files.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula {
namespace {

namespace v1 = ::specula::v1;

grpc::Status ToGrpc(const absl::Status& st) {
  // absl's codes are gRPC's codes, number for number.
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

ConstraintSpec FromProto(const v1::Constraint& c) {
  using Kind = ConstraintSpec::Kind;
  switch (c.kind_case()) {
    case v1::Constraint::kJsonSchema: return {Kind::kJsonSchema, c.json_schema(), {}, "constraint.json_schema"};
    case v1::Constraint::kRegex: return {Kind::kRegex, c.regex(), {}, "constraint.regex"};
    case v1::Constraint::kGrammar: return {Kind::kGrammar, c.grammar(), {}, "constraint.grammar"};
    case v1::Constraint::kChoice:
      return {Kind::kChoice, "", {c.choice().values().begin(), c.choice().values().end()}, "constraint.choice"};
    case v1::Constraint::kStructuralTag:
      return {Kind::kStructuralTag, c.structural_tag(), {}, "constraint.structural_tag"};
    case v1::Constraint::kJsonObject:
      return c.json_object() ? ConstraintSpec{Kind::kJsonObject, "", {}, "constraint.json_object"} : ConstraintSpec{};
    case v1::Constraint::KIND_NOT_SET: break;
  }
  return {};
}

// The request as the table's gRPC row takes it: proto3's zeros are its defaults (max_tokens 0: the
// server's --max-tokens), its fields are named under `sampling.` in errors.
ServeRequest FromProto(const v1::GenerateRequest& req) {
  ServeRequest r;
  r.surface = Surface::kGrpc;
  static_cast<RequestSpec&>(r) = SpecDefaults(r.surface);
  r.prompt = req.prompt();
  r.prompt_token_ids.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  const v1::SamplingParams& s = req.sampling();
  r.sampling.temperature = s.temperature();
  r.sampling.top_k = s.top_k();
  r.sampling.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();  // proto3's 0 is "unset": off
  r.sampling.min_p = s.min_p();
  r.sampling.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  if (s.has_seed()) r.seed = s.seed();
  r.max_tokens = s.max_tokens();
  r.stop_strings.assign(s.stop().begin(), s.stop().end());
  r.ignore_eos = s.ignore_eos();
  r.sampling.presence_penalty = s.presence_penalty();
  r.sampling.frequency_penalty = s.frequency_penalty();
  for (const auto& [id, bias] : s.logit_bias()) r.sampling.logit_bias.emplace_back(id, bias);
  std::sort(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end());  // a map's order is unspecified
  if (s.has_logprobs()) r.logprobs = s.logprobs();
  if (s.has_prompt_logprobs()) r.prompt_logprobs = s.prompt_logprobs();
  r.n = s.n() == 0 ? 1 : s.n();
  r.priority = req.priority();
  r.constraint = FromProto(req.constraint());
  r.cache_salt = req.cache_salt();  // proto3's empty string: none
  r.faq_query = r.prompt;  // the degrade path matches the prompt as given
  return r;
}

void AddLogprobs(const std::vector<TokenLogprobs>& from, google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* to) {
  for (const TokenLogprobs& lp : from) {
    v1::TokenLogprobs* t = to->Add();
    t->set_token_id(lp.token);
    t->set_logprob(lp.logprob);
    for (const auto& [id, v] : lp.top) {
      v1::TopLogprob* top = t->add_top();
      top->set_token_id(id);
      top->set_logprob(v);
    }
  }
}

void SetSpeculativeDecoding(const SpecStats& s, int32_t num_spec_tokens, v1::SpeculativeDecoding* to) {
  const SpecDecodingMetrics m = SpecDecodingMetricsOf(s, num_spec_tokens);
  to->set_mean_acceptance_length(m.mean_acceptance_length);
  to->set_draft_acceptance_rate(m.draft_acceptance_rate);
  to->mutable_acceptance_histogram()->Add(m.acceptance_histogram.begin(), m.acceptance_histogram.end());
  to->set_num_spec_steps(m.num_spec_steps);
  to->set_num_draft_tokens(m.num_draft_tokens);
  to->set_num_accepted_draft_tokens(m.num_accepted_draft_tokens);
  to->set_num_spec_tokens(m.num_spec_tokens);
  to->mutable_accepted_per_position()->Add(m.accepted_per_position.begin(), m.accepted_per_position.end());
  to->mutable_reached_per_position()->Add(m.reached_per_position.begin(), m.reached_per_position.end());
  to->set_num_forced_draft_tokens(m.num_forced_draft_tokens);
  to->set_num_accepted_forced_tokens(m.num_accepted_forced_tokens);
  to->set_num_grammar_cut_tokens(m.num_grammar_cut_tokens);
}

// `spec_tokens`: Server::spec_metrics_tokens; the speculative_decoding message where ShowsSpecDecoding.
// `kv_store`: the server has a shared KV store, whose use by the sample goes in kv_store.
void SetLast(const RequestOutput& out, int32_t spec_tokens, bool kv_store, v1::GenerateResponse* r) {
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::FinishReason_Parse(GrpcFinishName(out.finish), &reason);  // the table names the value
  r->set_finish_reason(reason);
  r->mutable_usage()->set_prompt_tokens(out.prompt_tokens);
  r->mutable_usage()->set_completion_tokens(static_cast<int32_t>(out.tokens.size()));
  r->mutable_usage()->set_cached_prompt_tokens(out.cached_prompt_tokens);
  r->mutable_spec()->set_num_drafts(out.spec.drafts);
  r->mutable_spec()->set_num_draft_tokens(out.spec.draft_tokens);
  r->mutable_spec()->set_num_accepted_tokens(out.spec.accepted_tokens);
  if (ShowsSpecDecoding(out.spec, spec_tokens)) {
    SetSpeculativeDecoding(out.spec, spec_tokens, r->mutable_speculative_decoding());
  }
  if (kv_store) {
    r->mutable_kv_store()->set_fetched_tokens(out.kv_store_tokens);
    r->mutable_kv_store()->set_fetch_ms(out.kv_fetch_ms);
    r->mutable_kv_store()->set_install_ms(out.kv_install_ms);
  }
}

// One Generate call. Event driven: the engine loop's push of a delta (the generation's listener) or
// the end of a write starts the next write; no thread waits per call. A cancelled call or a passed
// deadline (OnCancel) aborts the samples; their aborted last deltas then finish the call.
class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // On `bundle`: the model whose version the call's initial metadata named.
  GenerateReactor(Server* server, grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req,
                  std::shared_ptr<const ModelBundle> bundle)
      : ctx_(ctx), server_(server), spec_tokens_(server->spec_metrics_tokens(*bundle)),
        kv_store_(server->options().kv_store) {
    auto started = server->Generate(FromProto(req), std::move(bundle));
    if (!started.ok()) {
      Finish(ToGrpc(started.status()));
      return;
    }
    gen_ = *std::move(started);
    ctx_->AddInitialMetadata(kAnsweredByMetadata, gen_->answered_by());
    cancel_target_.store(gen_.get(), std::memory_order_release);
    request_id_ = req.request_id().empty() ? absl::StrCat("specula-", gen_->id()) : req.request_id();
    // The listener may outlive this reactor (a push racing OnDone): it holds the shared link.
    link_ = std::make_shared<Link>();
    link_->reactor = this;
    gen_->SetListener([link = link_] {
      std::lock_guard<std::mutex> lock(link->mu);
      if (link->reactor != nullptr) link->reactor->WriteNext();
    });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    writing_ = false;
    if (!ok && !broken_) {  // the client is gone: abort, and wait for the last deltas to finish
      broken_ = true;
      gen_->Cancel();
    }
    WriteNext();
  }
  // On a gRPC thread: through an atomic, since gRPC's ordering of this after the constructor (which
  // ran on another of its threads) is invisible to ThreadSanitizer. OnDone, which frees gen_, comes
  // after it.
  void OnCancel() override {
    if (Generation* g = cancel_target_.load(std::memory_order_acquire)) g->Cancel();
  }
  void OnDone() override {
    if (link_ != nullptr) {
      std::lock_guard<std::mutex> lock(link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Link {
    std::mutex mu;
    GenerateReactor* reactor = nullptr;
  };

  // The next event: one held back by the last message, or a new one.
  std::optional<Generation::Event> NextEvent() {
    if (held_.has_value()) return std::exchange(held_, std::nullopt);
    return gen_->Next(std::chrono::milliseconds(0));
  }

  // Sends what has arrived of one sample as one message (its deltas merge while a write is out).
  // Returns false when the call ended. link_->mu held.
  bool Collect(bool* any) {
    int32_t index = -1;
    while (auto e = NextEvent()) {
      if (index >= 0 && e->index != index) {  // another sample's: its own message
        held_ = std::move(e);
        break;
      }
      index = e->index;
      *any = true;
      RequestDelta& d = e->delta;
      response_.set_index(index);
      response_.mutable_token_ids()->Add(d.tokens.begin(), d.tokens.end());
      response_.mutable_text()->append(d.text);
      AddLogprobs(d.logprobs, response_.mutable_logprobs());
      AddLogprobs(d.prompt_logprobs, response_.mutable_prompt_logprobs());
      if (!d.finished) continue;
      SetLast(d.final, spec_tokens_, kv_store_, &response_);
      response_.set_answered_by(gen_->answered_by());
      response_.set_model_version(gen_->model_version());
      ++samples_done_;
      if (!d.error.ok() || d.final.finish == FinishReason::kAborted) {
        finished_ = true;
        gen_->Cancel();
        const bool late = ctx_->deadline() <= std::chrono::system_clock::now();
        Finish(!d.error.ok() ? ToGrpc(d.error)
               : late        ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded; the request was aborted")
                             : grpc::Status(grpc::StatusCode::CANCELLED, "the request was aborted"));
        return false;
      }
      break;
    }
    return true;
  }

  void WriteNext() {
    if (writing_ || finished_) return;
    response_.Clear();
    bool any = false;
    if (!Collect(&any) || !any) return;
    response_.set_request_id(request_id_);
    const bool last = samples_done_ == gen_->n();
    if (broken_) {
      if (last) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      }
      return;
    }
    if (last) {
      finished_ = true;
      if (std::string_view(gen_->answered_by()) == "faq") {
        server_->ObserveFaqAnswer(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
      }
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      writing_ = true;
      StartWrite(&response_);
    }
  }

  grpc::CallbackServerContext* const ctx_;
  Server* const server_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const int32_t spec_tokens_;  // Server::spec_metrics_tokens
  const bool kv_store_;        // ServeOptions::kv_store
  std::shared_ptr<Generation> gen_;
  std::atomic<Generation*> cancel_target_{nullptr};  // gen_, for OnCancel
  std::string request_id_;
  std::shared_ptr<Link> link_;
  v1::GenerateResponse response_;            // the message being written
  std::optional<Generation::Event> held_;    // the next sample's event, for the next message
  int32_t samples_done_ = 0;
  bool writing_ = false, finished_ = false, broken_ = false;  // guarded by link_->mu
};

// The replica's id and the model's version in the call's initial metadata, before anything is
// sent: a call refused at once (UNAUTHENTICATED, RESOURCE_EXHAUSTED, INVALID_ARGUMENT, UNAVAILABLE)
// carries them too, and custom metadata keeps such a call from being sent as trailers only.
void NameReplica(const Server* server, grpc::CallbackServerContext* ctx, const std::string& version) {
  const std::string& id = server->options().replica_id;
  if (!id.empty()) ctx->AddInitialMetadata(kReplicaMetadata, id);
  if (!version.empty()) ctx->AddInitialMetadata(kModelVersionMetadata, version);
}

// A Generate call refused before it reaches the server (no or a wrong API key).
class RefusedGenerate : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit RefusedGenerate(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// The API key, checked at the top of each Generation method rather than in a server interceptor:
// gRPC's (experimental) interceptors cannot end a call with a status of their own, and an
// AuthMetadataProcessor runs only on TLS ports and for every service alike. Here health and
// reflection stay open by construction, as in vLLM (probes need no key). The key is never echoed.
grpc::Status Authorize(const grpc::CallbackServerContext& ctx, const std::string& api_key) {
  if (api_key.empty()) return grpc::Status::OK;
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing `authorization: Bearer <key>` metadata: this server requires an API key");
  }
  if (!BearerMatches(std::string_view(it->second.data(), it->second.size()), api_key)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the `authorization` metadata is not `Bearer <key>` with this server's API key");
  }
  return grpc::Status::OK;
}

class GenerationService final : public v1::Generation::CallbackService {
 public:
  GenerationService(Server* server, std::string api_key) : server_(server), api_key_(std::move(api_key)) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* req) override {
    std::shared_ptr<const ModelBundle> bundle = server_->Current();
    NameReplica(server_, ctx, bundle->version);
    if (grpc::Status auth = Authorize(*ctx, api_key_); !auth.ok()) return new RefusedGenerate(auth);
    return new GenerateReactor(server_, ctx, *req, std::move(bundle));
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const v1::TokenizeRequest* req,
                                     v1::TokenizeResponse* resp) override {
    const std::shared_ptr<const ModelBundle> bundle = server_->Current();
    NameReplica(server_, ctx, bundle->version);
    if (grpc::Status auth = Authorize(*ctx, api_key_); !auth.ok()) return FinishUnary(ctx, auth);
    const Tokenizer& tok = *bundle->tokenizer;
    const std::vector<TokenId> ids = tok.Encode(req->text(), req->add_special_tokens() && bundle->add_bos);
    TokenId prev = -1;
    for (TokenId id : ids) {
      resp->add_token_ids(id);
      resp->add_tokens(tok.DecodeToken(prev, id));
      prev = id;
    }
    return FinishUnary(ctx, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx, const v1::ModelInfoRequest*,
                                      v1::ModelInfoResponse* resp) override {
    const std::shared_ptr<const ModelBundle> bundle = server_->Current();
    NameReplica(server_, ctx, bundle->version);
    if (grpc::Status auth = Authorize(*ctx, api_key_); !auth.ok()) return FinishUnary(ctx, auth);
    const ModelConfig& m = *bundle->model;
    const SchedulerConfig& sc = bundle->scheduler;
    resp->set_model(server_->options().model_name);
    resp->set_vocab_size(m.vocab_size);
    resp->set_max_model_len(sc.max_model_len);
    resp->set_num_layers(m.num_layers);
    resp->set_hidden_size(m.dim);
    resp->set_spec_method(bundle->spec_method);
    resp->set_num_spec_tokens(bundle->num_spec_tokens);
    resp->set_max_num_seqs(sc.max_num_seqs);
    resp->set_kv_cache_blocks(sc.num_blocks);
    resp->set_block_size(sc.block_size);
    resp->set_model_version(bundle->version);
    return FinishUnary(ctx, grpc::Status::OK);
  }

 private:
  Server* const server_;
  const std::string api_key_;  // empty: no key
};

// specula.v1.Admin: the Generation key, and refused on a server without one. Reload runs on the
// callback's thread while the new model loads: reloads are rare, and run one at a time.
class AdminService final : public v1::Admin::CallbackService {
 public:
  AdminService(Server* server, std::string api_key) : server_(server), api_key_(std::move(api_key)) {}

  grpc::ServerUnaryReactor* Reload(grpc::CallbackServerContext* ctx, const v1::ReloadRequest* req,
                                   v1::ReloadResponse* resp) override {
    NameReplica(server_, ctx, server_->Current()->version);
    if (api_key_.empty()) {
      return FinishUnary(ctx, grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                           "specula.v1.Admin: admin calls need the server started with --api-key"));
    }
    if (grpc::Status auth = Authorize(*ctx, api_key_); !auth.ok()) return FinishUnary(ctx, auth);
    if (req->model().empty()) {
      return FinishUnary(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "model: required (the new model's path)"));
    }
    const ReloadSpec spec{req->model(), req->tokenizer(), req->chat_template(), req->draft_model(), req->model_version()};
    absl::StatusOr<ReloadResult> r = server_->Reload(spec);
    if (!r.ok()) return FinishUnary(ctx, ToGrpc(r.status()));
    resp->set_model(r->source);
    resp->set_model_version(r->version);
    resp->set_previous_model_version(r->previous_version);
    resp->set_load_seconds(r->load_seconds);
    resp->set_previous_in_flight(r->previous_in_flight);
    return FinishUnary(ctx, grpc::Status::OK);
  }

 private:
  Server* const server_;
  const std::string api_key_;  // empty: no key, and no admin calls
};

// Plaintext, or TLS from the checked PEM files; with --ssl-ca-certs, clients must present a
// certificate those CAs signed.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const SecurityOptions& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  ASSIGN_OR_RETURN(TlsFiles files, ReadTlsFiles(security));
  grpc::SslServerCredentialsOptions options(files.ca_certs.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = files.ca_certs;
  options.pem_key_cert_pairs.push_back({files.private_key, files.cert_chain});
  return grpc::SslServerCredentials(options);
}

}  // namespace

absl::StatusOr<ServeRequest> ParseGenerateRequest(const std::string& bytes) {
  v1::GenerateRequest req;
  if (!req.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("request: not a specula.v1.GenerateRequest message");
  }
  return FromProto(req);
}

struct GrpcFrontend::Impl {
  std::unique_ptr<GenerationService> service;
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

GrpcFrontend::GrpcFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcFrontend::~GrpcFrontend() {
  if (impl_->server != nullptr) impl_->server->Shutdown(std::chrono::system_clock::now());
}

absl::StatusOr<std::unique_ptr<GrpcFrontend>> GrpcFrontend::Start(Server* server, const std::string& host, int port,
                                                                  const SecurityOptions& security) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, Credentials(security));
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<GenerationService>(server, security.api_key);
  impl->admin = std::make_unique<AdminService>(server, security.api_key);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // libgrpc++ serves health with messages of its own; reflection describes grpc.health.v1 from the
  // protobuf descriptors of proto/grpc/health/v1/health.proto, which this reference keeps linked.
  grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
  builder.AddListeningPort(address, credentials, &impl->port);
  builder.RegisterService(impl->service.get());
  builder.RegisterService(impl->admin.get());
  // Compressed requests (identity, deflate, gzip) are accepted: gRPC's default, kept on purpose.
  // Responses go uncompressed (no default algorithm): a streamed delta is a few token ids and bytes
  // of text, which gzip's per-message header and CPU would make no smaller.
  for (auto algorithm : {GRPC_COMPRESS_DEFLATE, GRPC_COMPRESS_GZIP}) {
    builder.SetCompressionAlgorithmSupportStatus(algorithm, true);
  }
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("--grpc-port: cannot listen on ", address, " (in use, or a bad --host",
                                               security.tls() ? "; or gRPC refused the --ssl-* files)" : ")"));
  }
  auto front = std::unique_ptr<GrpcFrontend>(new GrpcFrontend(std::move(impl)));
  front->SetServing(true);
  front->impl_->server->GetHealthCheckService()->SetServingStatus(kLivenessService, true);
  return front;
}

int GrpcFrontend::port() const { return impl_->port; }

// Per service name: the all-services form would take liveness down with readiness.
void GrpcFrontend::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = impl_->server->GetHealthCheckService();
  health->SetServingStatus("", serving);
  health->SetServingStatus(v1::Generation::service_full_name(), serving);
}

void GrpcFrontend::Shutdown(std::chrono::milliseconds grace) {
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server.reset();
}

}  // namespace specula
