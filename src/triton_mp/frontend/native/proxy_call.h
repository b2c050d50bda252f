// One call on the public port that the native server hands to the Python frontend as it
// came: any method, unary or streaming, relayed message by message to the Python grpc.aio
// server on its private unix socket (grpc::GenericStub) with the client's metadata and
// deadline; the Python side's initial metadata, messages, status, message, details and
// trailers come back to the client unchanged. The Python side alone writes Triton's words.
#ifndef TRITON_MP_NATIVE_PROXY_CALL_H_
#define TRITON_MP_NATIVE_PROXY_CALL_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>

#include "cq_tag.h"
#include "handoff.h"
#include "stop_cut.h"

namespace triton_mp {

// What every call shares: the public port's generic service, the completion queue that
// drives both sides, the stub of the Python server, when Python takes ModelStreamInfer
// calls in process the handoff (else nullptr), and the count of calls to arm once the
// current step is over (the completion-queue thread's: native_server.cc Poll arms them after
// a handed call's worker is woken, off the request's path), and what the server's stop learns
// from each call's end (stop_cut.h). Outlives every call.
struct ProxyTarget {
  grpc::AsyncGenericService* service;
  grpc::ServerCompletionQueue* cq;
  grpc::GenericStub* stub;
  Handoff* handoff;
  int* rearm;
  StopCut* stop_cut;
};

// Steps (each an Op; several may be pending at once, one per direction):
//   ARMED -> (new call) STARTING -> (backend call started) RELAYING
//   RELAYING: up   = client Read -> backend Write -> client Read ... -> backend WritesDone
//             down = backend Read -> client Write -> backend Read ... -> backend Finish
//   -> (backend Finish) FINISHING -> (client Finish) COMPLETE.
// A unary ModelInfer with a handoff never comes here: it is the registered method's
// (infer_call.h). A ModelStreamInfer with a handoff takes another way (stream_call.cc):
//   ARMED -> (new call) OPEN (Python has it, its end is reserved):
//     up   = client Read -> Push to Python -> client Read ... -> (half-close) HalfClose
//     down = (Python's message: Deliver) queued -> client Write -> next queued ...
//   -> (Python's end: Deliver final) the queued messages written -> FINISHING -> COMPLETE;
//   or OPEN -> (client gone) withdrawn.
// The object deletes itself when COMPLETE, or at shutdown, once no op is pending.
class ProxyCall final : public Awaiting {
 public:
  // Arms a new call object on the generic service (the completion-queue idiom's `new`:
  // the object owns itself from here on).
  static void Arm(const ProxyTarget& target);

  // Runs `step` for a completed op, then deletes the call when nothing is pending and the
  // call is over. Called by Op only.
  void Complete(void (ProxyCall::*step)(bool), bool ok);

  ProxyCall(const ProxyCall&) = delete;
  ProxyCall& operator=(const ProxyCall&) = delete;

  void Deliver(grpc::Status status, grpc::ByteBuffer* response, bool final) override;

 private:
  explicit ProxyCall(const ProxyTarget& target);
  ~ProxyCall() override = default;

  void StartBackend();

  // The handed-off stream (stream_call.cc).
  void OpenStream();
  void ReadStream();
  void OnStreamRead(bool ok);
  void QueueStreamMessage(grpc::ByteBuffer* message);
  void WriteStreamMessage();
  void OnStreamWritten(bool ok);
  void OnStreamEnded(bool ok);
  void FinishStreamIfIdle();

  void OnNew(bool ok);
  void OnStarted(bool ok);
  void OnUpRead(bool ok);
  void OnUpWritten(bool ok);
  void OnWritesDone(bool ok);
  void OnDownRead(bool ok);
  void OnDownWritten(bool ok);
  void OnBackendFinished(bool ok);
  void OnClientFinished(bool ok);
  void OnDone(bool ok);

  void Start(Op<ProxyCall>* op);
  void FinishBackendIfIdle();
  void SendInitialMetadataOnce();

  ProxyTarget target_;
  grpc::GenericServerContext server_ctx_;
  grpc::GenericServerAsyncReaderWriter server_stream_;
  grpc::ClientContext client_ctx_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> client_stream_;
  grpc::ByteBuffer up_;
  grpc::ByteBuffer down_;
  grpc::Status status_;

  Op<ProxyCall> new_op_{this, &ProxyCall::OnNew};
  Op<ProxyCall> started_op_{this, &ProxyCall::OnStarted};
  Op<ProxyCall> up_read_op_{this, &ProxyCall::OnUpRead};
  Op<ProxyCall> up_written_op_{this, &ProxyCall::OnUpWritten};
  Op<ProxyCall> writes_done_op_{this, &ProxyCall::OnWritesDone};
  Op<ProxyCall> down_read_op_{this, &ProxyCall::OnDownRead};
  Op<ProxyCall> down_written_op_{this, &ProxyCall::OnDownWritten};
  Op<ProxyCall> backend_finished_op_{this, &ProxyCall::OnBackendFinished};
  Op<ProxyCall> client_finished_op_{this, &ProxyCall::OnClientFinished};
  Op<ProxyCall> done_op_{this, &ProxyCall::OnDone};
  Op<ProxyCall> stream_read_op_{this, &ProxyCall::OnStreamRead};
  Op<ProxyCall> stream_written_op_{this, &ProxyCall::OnStreamWritten};

  // The handed stream's end status (Deliver final).
  grpc::Status reply_status_;
  uint64_t handoff_id_ = 0;   // nonzero: handed to Python, reply not yet delivered

  // The handed-off stream: Python's messages not yet written (the front one is being
  // written while stream_writing_), and whether Python ended it (reply_status_ says how).
  std::deque<grpc::ByteBuffer> outbox_;
  bool stream_writing_ = false;
  bool stream_ended_ = false;

  int pending_ = 0;           // ops handed to the completion queue and not yet back
  bool started_ = false;      // a client call arrived (RequestCall completed ok)
  bool done_ = false;         // OnDone ran: gRPC ended the call (answered or cancelled)
  bool up_writing_ = false;   // a backend Write or WritesDone is pending
  bool down_eof_ = false;     // the backend has no more messages
  bool backend_finishing_ = false;  // backend Finish called: nothing more goes up
  bool finishing_ = false;    // client Finish called: the call is over
  bool initial_sent_ = false; // the backend's initial metadata copied to the client
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_PROXY_CALL_H_
