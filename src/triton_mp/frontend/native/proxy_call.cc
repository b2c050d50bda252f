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
  if (pending_ == 0 && (finishing_ || !started_)) delete this;
}

namespace {
const char kModelInfer[] = "/inference.GRPCInferenceService/ModelInfer";
const char kModelStreamInfer[] = "/inference.GRPCInferenceService/ModelStreamInfer";
}  // namespace

void ProxyCall::OnNew(bool ok) {
  if (!ok) return;  // the server is shutting down: never started, deleted by Complete
  started_ = true;
  Start(&done_op_);
  ++*target_.rearm;  // NOTE: the next call is armed after this step (ProxyTarget)
  if (target_.handoff != nullptr && server_ctx_.method() == kModelInfer) {
    Start(&request_read_op_);
    server_stream_.Read(&up_, &request_read_op_);
    return;
  }
  if (target_.handoff != nullptr && server_ctx_.method() == kModelStreamInfer) {
    OpenStream();
    return;
  }
  StartBackend();
}

void ProxyCall::OnRequestRead(bool ok) {
  if (!ok) {  // no request message (the client went away): the Python server answers
    StartBackend();
    return;
  }
  if (done_ && server_ctx_.IsCancelled()) {
    // NOTE: the client cancelled before its request was read (OnDone came first): nothing
    // runs it, as in Triton (infer_handler.cc Process: a call cancelled at step START is
    // finished, never executed); the status reaches no one
    finishing_ = true;
    Start(&client_finished_op_);
    server_stream_.Finish(grpc::Status::CANCELLED, &client_finished_op_);
    return;
  }
  uint64_t id;
  if (target_.handoff->SubmitKnown(this, up_, &id)) {
    ++pending_;  // the reply, reserved, as below
    handoff_id_ = id;
    return;
  }
  std::vector<std::pair<std::string, std::string>> metadata;
  CopyMetadata(server_ctx_.client_metadata(),
               [&metadata](const std::string& k, const std::string& v) {
                 metadata.emplace_back(k, v);
               });
  ++pending_;  // the reply, reserved: Deliver completes it, or Withdraw releases it
  handoff_id_ = target_.handoff->Submit(this, std::move(up_), std::move(metadata));
}

void ProxyCall::Deliver(grpc::Status status, grpc::ByteBuffer response, bool final) {
  if (!final) {  // a stream's message
    QueueStreamMessage(std::move(response));
    return;
  }
  reply_status_ = std::move(status);
  reply_ = std::move(response);
  // the reserved reply op completes here
  Complete(stream_ ? &ProxyCall::OnStreamEnded : &ProxyCall::OnReply, true);
}

void ProxyCall::OnReply(bool) {
  handoff_id_ = 0;
  finishing_ = true;
  Start(&client_finished_op_);
  if (reply_status_.ok()) {
    server_stream_.WriteAndFinish(reply_, grpc::WriteOptions(), grpc::Status::OK,
                                  &client_finished_op_);
  } else {
    server_stream_.Finish(reply_status_, &client_finished_op_);
  }
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
