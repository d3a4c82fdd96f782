#include "serving/grpc_frontend.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula {
namespace {

namespace v1 = ::specula::v1;

grpc::Status ToGrpc(const absl::Status& st) {
  // absl's codes are gRPC's codes, number for number.
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

ServeRequest FromProto(const v1::GenerateRequest& req) {
  ServeRequest r;
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
  r.stop.assign(s.stop().begin(), s.stop().end());
  r.ignore_eos = s.ignore_eos();
  r.priority = req.priority();
  r.field_prefix = "sampling.";
  return r;
}

v1::FinishReason FinishOf(FinishReason f) {
  switch (f) {
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return v1::FINISH_REASON_STOP;
    case FinishReason::kMaxTokens: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAborted: return v1::FINISH_REASON_ABORTED;
    default: return v1::FINISH_REASON_UNSPECIFIED;
  }
}

// One Generate call. Event driven: the engine loop's push of a delta (the stream's listener) or the
// end of a write starts the next write; no thread waits per call. A cancelled call or a passed
// deadline (OnCancel) aborts the request; its aborted last delta then finishes the call.
class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Server* server, grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req)
      : server_(server), ctx_(ctx) {
    auto admitted = server->Submit(FromProto(req));
    if (!admitted.ok()) {
      Finish(ToGrpc(admitted.status()));
      return;
    }
    id_ = admitted->id;
    stream_ = admitted->stream;
    request_id_ = req.request_id().empty() ? absl::StrCat("specula-", id_) : req.request_id();
    // The listener may outlive this reactor (a push racing OnDone): it holds the shared link.
    link_ = std::make_shared<Link>();
    link_->reactor = this;
    stream_->SetListener([link = link_] {
      std::lock_guard<std::mutex> lock(link->mu);
      if (link->reactor != nullptr) link->reactor->WriteNext();
    });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    writing_ = false;
    if (!ok && !broken_) {  // the client is gone: abort, and wait for the last delta to finish
      broken_ = true;
      server_->Cancel(id_);
    }
    WriteNext();
  }
  void OnCancel() override {
    if (stream_ != nullptr) server_->Cancel(id_);
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

  // Sends what has arrived as one message (several deltas merge while a write is out). link_->mu held.
  void WriteNext() {
    if (writing_ || finished_) return;
    response_.Clear();
    bool any = false, last = false;
    while (auto d = stream_->Next(std::chrono::milliseconds(0))) {
      any = true;
      response_.mutable_token_ids()->Add(d->tokens.begin(), d->tokens.end());
      response_.mutable_text()->append(d->text);
      if (d->finished) {
        last = true;
        const RequestOutput& out = d->final;
        response_.set_finish_reason(FinishOf(out.finish));
        response_.mutable_usage()->set_prompt_tokens(out.prompt_tokens);
        response_.mutable_usage()->set_completion_tokens(static_cast<int32_t>(out.tokens.size()));
        response_.mutable_usage()->set_cached_prompt_tokens(out.cached_prompt_tokens);
        response_.mutable_spec()->set_num_drafts(out.spec.drafts);
        response_.mutable_spec()->set_num_draft_tokens(out.spec.draft_tokens);
        response_.mutable_spec()->set_num_accepted_tokens(out.spec.accepted_tokens);
        if (!d->error.ok()) {
          finished_ = true;
          Finish(ToGrpc(d->error));
          return;
        }
        if (out.finish == FinishReason::kAborted) {
          finished_ = true;
          const bool late = ctx_->deadline() <= std::chrono::system_clock::now();
          Finish(late ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded; the request was aborted")
                      : grpc::Status(grpc::StatusCode::CANCELLED, "the request was aborted"));
          return;
        }
        break;
      }
    }
    if (!any) return;
    response_.set_request_id(request_id_);
    if (broken_) {
      if (last) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      }
      return;
    }
    if (last) {
      finished_ = true;
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      writing_ = true;
      StartWrite(&response_);
    }
  }

  Server* const server_;
  grpc::CallbackServerContext* const ctx_;
  RequestId id_ = 0;
  std::shared_ptr<RequestStream> stream_;
  std::string request_id_;
  std::shared_ptr<Link> link_;
  v1::GenerateResponse response_;  // the message being written
  bool writing_ = false, finished_ = false, broken_ = false;  // guarded by link_->mu
};

class GenerationService final : public v1::Generation::CallbackService {
 public:
  explicit GenerationService(Server* server) : server_(server) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* req) override {
    return new GenerateReactor(server_, ctx, *req);
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const v1::TokenizeRequest* req,
                                     v1::TokenizeResponse* resp) override {
    const Tokenizer& tok = server_->tokenizer();
    const std::vector<TokenId> ids =
        tok.Encode(req->text(), req->add_special_tokens() && server_->options().add_bos);
    TokenId prev = -1;
    for (TokenId id : ids) {
      resp->add_token_ids(id);
      resp->add_tokens(tok.DecodeToken(prev, id));
      prev = id;
    }
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx, const v1::ModelInfoRequest*,
                                      v1::ModelInfoResponse* resp) override {
    const ModelConfig& m = server_->model_config();
    const SchedulerConfig& sc = server_->scheduler_config();
    resp->set_model(server_->options().model_name);
    resp->set_vocab_size(m.vocab_size);
    resp->set_max_model_len(sc.max_model_len);
    resp->set_num_layers(m.num_layers);
    resp->set_hidden_size(m.dim);
    resp->set_spec_method(server_->options().spec_method);
    resp->set_num_spec_tokens(server_->options().num_spec_tokens);
    resp->set_max_num_seqs(sc.max_num_seqs);
    resp->set_kv_cache_blocks(sc.num_blocks);
    resp->set_block_size(sc.block_size);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  Server* const server_;
};

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
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

GrpcFrontend::GrpcFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcFrontend::~GrpcFrontend() {
  if (impl_->server != nullptr) impl_->server->Shutdown(std::chrono::system_clock::now());
}

absl::StatusOr<std::unique_ptr<GrpcFrontend>> GrpcFrontend::Start(Server* server, const std::string& host, int port,
                                                                  const SecurityOptions& security) {
  if (!security.api_key.empty() || security.tls()) {
    return absl::UnimplementedError("--api-key and --ssl-*: not supported yet on gRPC");
  }
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<GenerationService>(server);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &impl->port);
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("--grpc-port: cannot listen on ", address, " (in use, or a bad --host)"));
  }
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  return std::unique_ptr<GrpcFrontend>(new GrpcFrontend(std::move(impl)));
}

int GrpcFrontend::port() const { return impl_->port; }

void GrpcFrontend::SetServing(bool serving) { impl_->server->GetHealthCheckService()->SetServingStatus(serving); }

void GrpcFrontend::Shutdown(std::chrono::milliseconds grace) {
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server.reset();
}

}  // namespace specula
