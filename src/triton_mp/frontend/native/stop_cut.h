// What the native server's stop learns from its calls, and the two things it decides.
// - Whether the stop cut calls. NativeServer::Stop arms it with the deadline it gives
//   grpc::Server::Shutdown; at that deadline grpc cancels every call still running, so a call
//   whose done notification says "cancelled" at or after it was cut by the stop (a client that
//   went away earlier was done earlier). The frontend then exits with
//   ipc.handshake.CALLS_CUT_EXIT and the supervisor logs 2.51's "Exit timeout expired" and
//   exits 1 (frontend/main.py _drain, supervisor/main.py _stop_all).
// - When no call runs any more, the connections left are closed at once
//   (grpc_server_cancel_all_calls, what Shutdown itself does at the deadline). Without it a
//   connection whose client answers nothing (a stopped process) held the stop up to the whole
//   budget: grpc's graceful GOAWAY waits up to 20 s for its ping's answer before it lets the
//   connection go, though nothing is left to hand over (2.51 waits those 20 s, exit 0;
//   docs/differences.md). The calls counted are those that started (OnStart, a call matched)
//   and are not done (OnDone); the shutdown is known to have begun when it refuses a call
//   armed ahead (OnRefused: its new-call op fails once Shutdown began), which comes after
//   every call matched before it on the completion queue.
// - When the completion queue may shut: once every started call object is gone (OnGone, just
//   before its delete), bounded by kGoneWaitS (AwaitGone). A relayed call outlives its public
//   side: once that is done (cut at the deadline, say) it cancels its backend call, whose end
//   then starts the call's last ops on the queue; an op started on a queue already shut down
//   aborts the process (grpc's "assertion failed: grpc_cq_begin_op").
// Arm and AwaitGone run on Stop's thread, the rest on the completion-queue thread (in its
// steps, under the server's serial lock): `armed_` is released after the deadline and the
// server are written; `gone_` is atomic; the count and the flags are that thread's alone.
#ifndef TRITON_MP_NATIVE_STOP_CUT_H_
#define TRITON_MP_NATIVE_STOP_CUT_H_

#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace triton_mp {

class StopCut {
 public:
  // How long Stop waits for started calls to go before it shuts the queue (AwaitGone): the
  // cancelled backend calls end in milliseconds; a call still waiting for Python's answer then
  // is released by the handoff's Close, after this wait.
  static constexpr double kGoneWaitS = 1.0;

  // The stop of `server` begins: returns Shutdown's deadline, grace_s from now on gRPC's
  // monotonic clock (the clock Shutdown waits on, so "at or after" is exact).
  gpr_timespec Arm(double grace_s, grpc_server* server) {
    server_ = server;
    deadline_ = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                             gpr_time_from_micros(static_cast<int64_t>(grace_s * 1e6),
                                                  GPR_TIMESPAN));
    armed_.store(true, std::memory_order_release);
    return deadline_;
  }

  // A call started (its new-call op succeeded).
  void OnStart() {
    ++running_;
    alive_.fetch_add(1, std::memory_order_relaxed);
  }

  // A started call's object is deleted now (its last op completed).
  void OnGone() { alive_.fetch_sub(1, std::memory_order_release); }

  // Waits until every started call object is gone, at most kGoneWaitS (Stop, after Shutdown
  // returned: no call starts any more). Returns whether they all went.
  bool AwaitGone() {
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(kGoneWaitS * 1000));
    while (alive_.load(std::memory_order_acquire) > 0) {
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // A call armed ahead was refused: the server is shutting down.
  void OnRefused() {
    if (!armed_.load(std::memory_order_acquire)) return;
    shutting_down_ = true;
    CloseIfIdle();
  }

  // A started call's done notification (its OnDone); `ctx` is that call's. Before a stop
  // this is a decrement and one atomic load.
  void OnDone(const grpc::ServerContextBase& ctx) {
    --running_;
    if (!armed_.load(std::memory_order_acquire)) return;
    if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline_) >= 0 && ctx.IsCancelled()) {
      cut_.store(true, std::memory_order_relaxed);
    }
    if (shutting_down_) CloseIfIdle();
  }

  // Whether a call was cut (read once the completion-queue thread has joined).
  bool cut() const { return cut_.load(std::memory_order_relaxed); }

 private:
  void CloseIfIdle() {
    if (running_ != 0 || closed_) return;
    closed_ = true;
    grpc_server_cancel_all_calls(server_);
  }

  grpc_server* server_ = nullptr;
  gpr_timespec deadline_{};
  std::atomic<bool> armed_{false};
  std::atomic<bool> cut_{false};
  std::atomic<int64_t> alive_{0};  // call objects started and not deleted
  int64_t running_ = 0;         // calls started and not done
  bool shutting_down_ = false;  // a call armed ahead was refused after Arm
  bool closed_ = false;         // the connections were closed
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_STOP_CUT_H_
