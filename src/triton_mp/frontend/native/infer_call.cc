// See infer_call.h. Steps run under the server's serial lock: a call's fields need no lock.
#include "infer_call.h"

#include <string>
#include <utility>
#include <vector>

#include "metadata.h"

namespace triton_mp {

void InferCall::Arm(const InferTarget& target) {
  auto* call = new InferCall(target);  // owned by the completion queue from here on
  ++call->pending_;                    // new_op_
  target.service->RequestInfer(&call->ctx_, &call->request_, &call->responder_, target.cq,
                               &call->new_op_);
}

InferCall::InferCall(const InferTarget& target) : target_(target), responder_(&ctx_) {
  // NOTE: must precede the request; gRPC delivers it only for a call that started
  ctx_.AsyncNotifyWhenDone(&done_op_);
}

void InferCall::Complete(void (InferCall::*step)(bool), bool ok) {
  --pending_;
  (this->*step)(ok);
  if (pending_ == 0 && (finishing_ || !started_)) {
    if (started_) target_.stop_cut->OnGone();
    delete this;
  }
}

void InferCall::OnNew(bool ok) {
  if (!ok) {  // the server is shutting down: never started, deleted by Complete
    target_.stop_cut->OnRefused();
    return;
  }
  started_ = true;
  target_.stop_cut->OnStart();
  ++pending_;        // done_op_
  ++*target_.rearm;  // NOTE: the next call is armed after this step (InferTarget)
  // NOTE: the request came with the call, and the done notification starts with it (gRPC
  // begins it while finalizing this op): a client that cancels from here on is withdrawn
  // (OnDone), as a generic call cancelled after its Read was
  uint64_t id;
  if (target_.handoff->SubmitKnown(this, request_, &id)) {
    ++pending_;  // the reply, reserved: Deliver completes it, or Withdraw releases it
    handoff_id_ = id;
    return;
  }
  std::vector<std::pair<std::string, std::string>> metadata;
  CopyMetadata(ctx_.client_metadata(), [&metadata](const std::string& k, const std::string& v) {
    metadata.emplace_back(k, v);
  });
  ++pending_;  // the reply, reserved, as above
  handoff_id_ = target_.handoff->Submit(this, std::move(request_), std::move(metadata));
}

void InferCall::Deliver(grpc::Status status, grpc::ByteBuffer* response, bool) {
  // NOTE: a unary call: every delivery is its end (final)
  reply_status_ = std::move(status);
  reply_.Swap(response);  // NOTE: not a std::move, which copies a grpc::ByteBuffer
  Complete(&InferCall::OnReply, true);  // the reserved reply op completes here
}

void InferCall::OnReply(bool) {
  handoff_id_ = 0;
  finishing_ = true;
  ++pending_;  // finished_op_
  if (reply_status_.ok()) {
    responder_.Finish(reply_, grpc::Status::OK, &finished_op_);
  } else {
    responder_.FinishWithError(reply_status_, &finished_op_);
  }
}

void InferCall::OnFinished(bool) {}

void InferCall::OnDone(bool) {
  target_.stop_cut->OnDone(ctx_);
  if (handoff_id_ == 0) return;
  // NOTE: handed over and not answered: the call is over (cancelled, deadline, shutdown).
  // Withdrawn before the reply, no reply comes: release its reservation.
  if (target_.handoff->Withdraw(handoff_id_)) {
    handoff_id_ = 0;
    finishing_ = true;
    --pending_;
  }
}

}  // namespace triton_mp
