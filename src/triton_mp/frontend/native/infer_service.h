// ModelInfer as a registered raw method of the public port: gRPC reads a unary call's request
// message with the call itself and hands it over as bytes (grpc::ByteBuffer), so a call
// reaches the completion-queue thread once, request included (infer_call.h), where the
// generic service (proxy_call.h) needed a second completion for its Read. Every other method,
// ModelStreamInfer included, stays the generic service's. Registered only when ModelInfer is
// handed to Python in process (native_server.h, NativeServerOptions::handoff); nothing is
// parsed here: the bytes go where the generic path sent them (Handoff::SubmitKnown, Submit).
// What grpc's generated WithRawMethod_ModelInfer<AsyncService> does, without generated code.
#ifndef TRITON_MP_NATIVE_INFER_SERVICE_H_
#define TRITON_MP_NATIVE_INFER_SERVICE_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/async_unary_call.h>

namespace triton_mp {

inline constexpr char kModelInferMethod[] = "/inference.GRPCInferenceService/ModelInfer";

class InferService final : public grpc::Service {
 public:
  InferService() {
    // NOTE: no handler and marked raw: an async method whose request is a ByteBuffer
    // (gRPC owns the method object from here on)
    AddMethod(new grpc::internal::RpcServiceMethod(
        kModelInferMethod, grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    MarkMethodRaw(0);
  }

  // Asks for the next ModelInfer call: `tag` completes on `cq` with the call and its
  // request message in *request.
  void RequestInfer(grpc::ServerContext* context, grpc::ByteBuffer* request,
                    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* response,
                    grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncUnary(0, context, request, response, cq, cq, tag);
  }
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_INFER_SERVICE_H_
