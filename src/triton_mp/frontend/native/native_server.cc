// See native_server.h.
#include "native_server.h"

#include <absl/synchronization/mutex.h>
#include <pthread.h>

#include "answer_borrow.h"
#include "connection_cut.h"
#include "cq_tag.h"
#include "proxy_call.h"

namespace triton_mp {

std::unique_ptr<NativeServer> NativeServer::Start(const NativeServerOptions& options) {
  // NOTE: the system's abseil (Debian's libabsl 20220623) is built without NDEBUG, so every
  // absl::Mutex gRPC locks or destroys runs absl's debug deadlock detector: a global graph
  // under one spin lock, a node lookup per Lock, a stack trace per new edge, RemoveNode per
  // destroyed mutex. A release build never runs it; this turns it off for the process (grpcio
  // links its own abseil: Python's gRPC is untouched). perf at id1m_shm: GraphCycles alone
  // was ~2% of the frontend's samples.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::unique_ptr<NativeServer> s(new NativeServer());
  if (options.handoff) {
    s->handoff_ = std::make_unique<Handoff>();
    if (!s->handoff_->ok()) return nullptr;
  }
  grpc::ChannelArguments backend_args;
  backend_args.SetMaxReceiveMessageSize(-1);
  backend_args.SetMaxSendMessageSize(-1);
  s->channel_ = grpc::CreateCustomChannel(options.backend, grpc::InsecureChannelCredentials(),
                                          backend_args);
  s->stub_ = std::make_unique<grpc::GenericStub>(s->channel_);

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &s->port_);
  // NOTE: a registered method is matched before the generic service sees a call
  if (s->handoff_) builder.RegisterService(&s->infer_service_);
  builder.RegisterAsyncGenericService(&s->service_);
  for (const auto& kv : options.channel_args) builder.AddChannelArgument(kv.first, kv.second);
  s->cq_ = builder.AddCompletionQueue();
  if (s->handoff_) s->handoff_->Attach(&s->serial_);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    if (s->server_) s->server_->Shutdown();
    s->cq_->Shutdown();
    void* tag;
    bool ok;
    while (s->cq_->Next(&tag, &ok)) static_cast<Tag*>(tag)->Proceed(ok);
    s->server_.reset();
    s->stopped_ = true;
    return nullptr;
  }
  s->target_ = ProxyTarget{&s->service_, s->cq_.get(), s->stub_.get(), s->handoff_.get(),
                          &s->rearm_, &s->stop_cut_};
  for (int i = 0; i < options.pending_calls; ++i) ProxyCall::Arm(s->target_);
  if (s->handoff_) {
    s->infer_target_ = InferTarget{&s->infer_service_, s->cq_.get(), s->handoff_.get(),
                                   &s->infer_rearm_, &s->stop_cut_};
    for (int i = 0; i < options.pending_calls; ++i) InferCall::Arm(s->infer_target_);
  }
  s->thread_ = std::thread([raw = s.get()] { raw->Poll(); });
  return s;
}

void NativeServer::Poll() {
  // NOTE: a name for top -H, perf and /proc/<pid>/task (bench/README.md: wake-ups per thread)
  pthread_setname_np(pthread_self(), "tmp-grpc-cq");
  AnswerBorrow borrow;  // NOTE: given back before the loop ends (its destructor)
  void* tag;
  bool ok;
  while (true) {
    grpc::CompletionQueue::NextStatus next;
    if (borrow.active()) {
      // NOTE: waiting for an answer here (answer_borrow.h): the queue is polled, not slept on
      next = cq_->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
    } else {
      next = cq_->Next(&tag, &ok) ? grpc::CompletionQueue::GOT_EVENT
                                  : grpc::CompletionQueue::SHUTDOWN;
    }
    if (next == grpc::CompletionQueue::SHUTDOWN) break;
    if (next == grpc::CompletionQueue::GOT_EVENT) {
      {
        // NOTE: a Kick delivering answers hands the rest to this thread (handoff.h LockStep)
        if (handoff_) {
          handoff_->LockStep();
        } else {
          serial_.lock();
        }
        std::lock_guard<std::mutex> serial(serial_, std::adopt_lock);
        static_cast<Tag*>(tag)->Proceed(ok);
      }
      // NOTE: a worker woken under the serial lock could answer before this thread lets go
      // of it (handoff.h PostAfterStep); the answers a Kick left during the step go after
      // that wake-up
      if (handoff_) {
        borrow.AfterStep(handoff_.get());
        handoff_->PostAfterStep();
        handoff_->DeliverDue();
      }
      // NOTE: after the worker's wake-up: a new call object and its RequestCall are not on
      // the request's path (pending_calls are armed ahead)
      for (; rearm_ > 0; --rearm_) ProxyCall::Arm(target_);
      for (; infer_rearm_ > 0; --infer_rearm_) InferCall::Arm(infer_target_);
    }
    borrow.Poll();
  }
}

bool NativeServer::Stop(double grace_s) {
  if (stopped_) return false;
  stopped_ = true;
  const gpr_timespec deadline = stop_cut_.Arm(grace_s, server_->c_server());
  bool connections_cut = false;
  {
    // NOTE: a connection whose client stopped reading holds Shutdown past its deadline
    // (connection_cut.h); the cut comes only while Shutdown still waits
    ConnectionCut cut(port_, grace_s);
    server_->Shutdown(deadline);
    connections_cut = cut.Done();
  }
  // NOTE: relayed calls start their last ops after their public side is done (stop_cut.h)
  stop_cut_.AwaitGone();
  if (handoff_) handoff_->Close();
  cq_->Shutdown();
  if (thread_.joinable()) thread_.join();
  // NOTE: after the join: every call's OnDone has run
  return stop_cut_.cut() || connections_cut;
}

NativeServer::~NativeServer() { Stop(0); }

}  // namespace triton_mp
