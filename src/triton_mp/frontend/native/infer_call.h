// One unary ModelInfer call on the public port, taken through the registered raw method
// (infer_service.h) while ModelInfer is handed to Python in process: the request arrives with
// the call, is submitted by C++ when it matches a lesson (Handoff::SubmitKnown) or queued for
// Python as it came with its metadata (Handoff::Submit), and the answer (Deliver: C++'s for a
// known call, else Python's, its status and words Python's alone) ends the call. The same
// steps as proxy_call.h's "unary ModelInfer with a handoff", less its Read:
//   ARMED -> (new call, request read) HANDED (the reply op is reserved) -> (reply: Deliver)
//   FINISHING -> COMPLETE; or HANDED -> (client gone) withdrawn.
// Steps run under the server's serial lock (native_server.h), as ProxyCall's.
#ifndef TRITON_MP_NATIVE_INFER_CALL_H_
#define TRITON_MP_NATIVE_INFER_CALL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "cq_tag.h"
#include "handoff.h"
#include "infer_service.h"
#include "stop_cut.h"

namespace triton_mp {

// What every InferCall shares (outlives them): the registered service, the completion queue,
// the handoff, the count of calls to arm after the current step (native_server.cc Poll,
// as ProxyTarget::rearm), and what the server's stop learns from each call's end.
struct InferTarget {
  InferService* service;
  grpc::ServerCompletionQueue* cq;
  Handoff* handoff;
  int* rearm;
  StopCut* stop_cut;
};

class InferCall final : public Awaiting {
 public:
  // Arms a new call object on the registered method (the completion-queue idiom's `new`:
  // the object owns itself from here on).
  static void Arm(const InferTarget& target);

  // Runs `step` for a completed op, then deletes the call when nothing is pending and the
  // call is over. Called by Op only.
  void Complete(void (InferCall::*step)(bool), bool ok);

  InferCall(const InferCall&) = delete;
  InferCall& operator=(const InferCall&) = delete;

  void Deliver(grpc::Status status, grpc::ByteBuffer* response, bool final) override;

 private:
  explicit InferCall(const InferTarget& target);
  ~InferCall() override = default;

  void OnNew(bool ok);
  void OnReply(bool ok);
  void OnFinished(bool ok);
  void OnDone(bool ok);

  InferTarget target_;
  grpc::ServerContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_;

  Op<InferCall> new_op_{this, &InferCall::OnNew};
  Op<InferCall> finished_op_{this, &InferCall::OnFinished};
  Op<InferCall> done_op_{this, &InferCall::OnDone};

  grpc::Status reply_status_;
  grpc::ByteBuffer reply_;
  uint64_t handoff_id_ = 0;  // nonzero: handed over, reply not yet delivered

  int pending_ = 0;         // ops handed to the completion queue (or reserved) and not back
  bool started_ = false;    // a client call arrived (RequestInfer completed ok)
  bool finishing_ = false;  // Finish called: the call is over
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_INFER_CALL_H_
