// The native gRPC server of one frontend process: owns the public gRPC port, hands
// ModelInfer (its registered method, InferCall) and ModelStreamInfer calls to the Python
// frontend in process (Handoff) and relays every other call
// to the Python grpc.aio server on a private unix socket (ProxyCall), and runs one
// completion-queue thread that never takes the GIL.
#ifndef TRITON_MP_NATIVE_NATIVE_SERVER_H_
#define TRITON_MP_NATIVE_NATIVE_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "handoff.h"
#include "infer_call.h"
#include "infer_service.h"
#include "proxy_call.h"
#include "stop_cut.h"

namespace triton_mp {

struct NativeServerOptions {
  std::string address;      // the public "host:port" (port 0: any)
  std::string backend;      // the Python server's target, "unix:/path"
  // grpc core args of the public port, as the Python server's (frontend.main.grpc_options:
  // message limits, grpc.so_reuseport, keepalive, grpc.default_compression_level)
  std::vector<std::pair<std::string, int>> channel_args;
  bool handoff = false;     // ModelInfer and ModelStreamInfer go to Python in process
  int pending_calls = 8;      // calls armed ahead on the completion queue
};

class NativeServer {
 public:
  // Binds and starts serving. Returns nullptr when the port cannot be bound (the words are
  // Python's).
  static std::unique_ptr<NativeServer> Start(const NativeServerOptions& options);
  ~NativeServer();
  NativeServer(const NativeServer&) = delete;
  NativeServer& operator=(const NativeServer&) = delete;

  int port() const { return port_; }
  // The in-process handoff, or nullptr when ModelInfer is relayed like every other call.
  Handoff* handoff() { return handoff_.get(); }
  // Stops accepting, closes the connections once no call runs, cancels calls still running
  // after grace_s, drains the queue, joins. Returns whether it cancelled a call that was
  // still running then (stop_cut.h) or cut a connection whose answers were stuck unsent
  // (connection_cut.h); false when stopped already.
  bool Stop(double grace_s);

 private:
  NativeServer() = default;
  void Poll();

  grpc::AsyncGenericService service_;
  // ModelInfer's registered method, with a handoff (infer_service.h)
  InferService infer_service_;
  // Held while a step runs: on the completion-queue thread, or on the Python thread when
  // the handoff delivers Python's answers (Handoff::Kick).
  std::mutex serial_;
  std::unique_ptr<Handoff> handoff_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::thread thread_;
  ProxyTarget target_{};
  int rearm_ = 0;  // calls to arm after the current step (ProxyTarget::rearm)
  InferTarget infer_target_{};
  int infer_rearm_ = 0;  // ModelInfer calls to arm after the current step (InferTarget)
  StopCut stop_cut_;     // whether Stop cut calls (every call's OnDone tells it)
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_NATIVE_SERVER_H_
