// See proxy_call.h. Steps run under the server's serial lock (native_server.h): no two steps
// at once, so a call's fields need no lock.
#include "proxy_call.h"

#include <string>

#include "metadata.h"

namespace triton_mp {

void ProxyCall::Arm(const ProxyTarget& target) {
  auto* call = new ProxyCall(target);  // owned by the completion queue from here on
  call->Start(&call->new_op_);
  target.service->RequestCall(&call->server_ctx_, &call->server_stream_, target.cq, target.cq,
                              &call->new_op_);
}

ProxyCall::ProxyCall(const ProxyTarget& target)
    : target_(target), server_stream_(&server_ctx_) {
  // NOTE: must precede RequestCall; gRPC delivers it only for a call that started.
  server_ctx_.AsyncNotifyWhenDone(&done_op_);
}

void ProxyCall::Start(Op<ProxyCall>*) { ++pending_; }

void ProxyCall::Complete(void (ProxyCall::*step)(bool), bool ok) {
  --pending_;
  (this->*step)(ok);
  if (pending_ == 0 && (finishing_ || !started_)) {
    if (started_) target_.stop_cut->OnGone();
    delete this;
  }
}

namespace {
const char kModelStreamInfer[] = "/inference.GRPCInferenceService/ModelStreamInfer";
}  // namespace

void ProxyCall::OnNew(bool ok) {
  if (!ok) {  // the server is shutting down: never started, deleted by Complete
    target_.stop_cut->OnRefused();
    return;
  }
  started_ = true;
  target_.stop_cut->OnStart();
  Start(&done_op_);
  ++*target_.rearm;  // NOTE: the next call is armed after this step (ProxyTarget)
  // NOTE: with a handoff, ModelInfer is the registered method's (infer_call.h), never here
  if (target_.handoff != nullptr && server_ctx_.method() == kModelStreamInfer) {
    OpenStream();
    return;
  }
  StartBackend();
}

void ProxyCall::Deliver(grpc::Status status, grpc::ByteBuffer* response, bool final) {
  if (!final) {  // a stream's message
    QueueStreamMessage(response);
    return;
  }
  reply_status_ = std::move(status);
  // the reserved end op completes here (only streams are handed: unary ModelInfer is
  // InferCall's)
  Complete(&ProxyCall::OnStreamEnded, true);
}

void ProxyCall::StartBackend() {
  CopyRequestMetadata(server_ctx_, &client_ctx_);
  client_ctx_.set_deadline(server_ctx_.deadline());
  client_stream_ = target_.stub->PrepareCall(&client_ctx_, server_ctx_.method(), target_.cq);
  Start(&started_op_);
  client_stream_->StartCall(&started_op_);
  // NOTE: a client that cancelled before its request was read: OnDone ran with no backend
  // call to cancel, and the Python side would wait for a message that never comes (without
  // a deadline, until the server stops: a drain then waits out its whole grace)
  if (done_ && server_ctx_.IsCancelled()) client_ctx_.TryCancel();
}

void ProxyCall::OnStarted(bool ok) {
  if (!ok) {  // the Python side cannot be reached: its status says why
    down_eof_ = true;
    FinishBackendIfIdle();
    return;
  }
  Start(&up_read_op_);
  server_stream_.Read(&up_, &up_read_op_);
  Start(&down_read_op_);
  client_stream_->Read(&down_, &down_read_op_);
}

void ProxyCall::OnUpRead(bool ok) {
  if (backend_finishing_) return;  // the answer is decided: drop what the client still sends
  if (!ok) {  // the client half-closed (or went away: OnDone cancels)
    up_writing_ = true;
    Start(&writes_done_op_);
    client_stream_->WritesDone(&writes_done_op_);
    return;
  }
  up_writing_ = true;
  Start(&up_written_op_);
  client_stream_->Write(up_, &up_written_op_);
}

void ProxyCall::OnUpWritten(bool ok) {
  up_writing_ = false;
  if (backend_finishing_ || !ok || down_eof_) {  // the Python side stopped reading
    FinishBackendIfIdle();
    return;
  }
  Start(&up_read_op_);
  server_stream_.Read(&up_, &up_read_op_);
}

void ProxyCall::OnWritesDone(bool) {
  up_writing_ = false;
  FinishBackendIfIdle();
}

void ProxyCall::OnDownRead(bool ok) {
  if (!ok) {
    down_eof_ = true;
    FinishBackendIfIdle();
    return;
  }
  SendInitialMetadataOnce();
  Start(&down_written_op_);
  server_stream_.Write(down_, &down_written_op_);
}

void ProxyCall::OnDownWritten(bool ok) {
  // NOTE: a failed write means the client is gone: cancel the Python side's call and read on
  // until its status ends the call.
  if (!ok) client_ctx_.TryCancel();
  Start(&down_read_op_);
  client_stream_->Read(&down_, &down_read_op_);
}

void ProxyCall::FinishBackendIfIdle() {
  // NOTE: one op of each kind at a time: Finish waits for a pending backend Write.
  if (backend_finishing_ || up_writing_ || !down_eof_) return;
  backend_finishing_ = true;
  Start(&backend_finished_op_);
  client_stream_->Finish(&status_, &backend_finished_op_);
}

void ProxyCall::SendInitialMetadataOnce() {
  if (initial_sent_) return;
  initial_sent_ = true;
  CopyMetadata(client_ctx_.GetServerInitialMetadata(),
               [this](const std::string& k, const std::string& v) {
                 server_ctx_.AddInitialMetadata(k, v);
               });
}

void ProxyCall::OnBackendFinished(bool) {
  SendInitialMetadataOnce();
  CopyMetadata(client_ctx_.GetServerTrailingMetadata(),
               [this](const std::string& k, const std::string& v) {
                 server_ctx_.AddTrailingMetadata(k, v);
               });
  finishing_ = true;
  Start(&client_finished_op_);
  server_stream_.Finish(status_, &client_finished_op_);
}

void ProxyCall::OnClientFinished(bool) {}

void ProxyCall::OnDone(bool) {
  done_ = true;
  target_.stop_cut->OnDone(server_ctx_);
  if (handoff_id_ != 0) {
    // NOTE: handed to Python and not answered: the call is over (cancelled, deadline,
    // shutdown). Withdrawn before Python replied, no reply comes: release its reservation.
    if (target_.handoff->Withdraw(handoff_id_)) {
      handoff_id_ = 0;
      finishing_ = true;
      --pending_;
    }
    return;
  }
  if (server_ctx_.IsCancelled() && !finishing_ && client_stream_) client_ctx_.TryCancel();
}

}  // namespace triton_mp
