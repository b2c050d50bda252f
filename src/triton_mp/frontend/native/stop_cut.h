// Whether the native server's stop cut calls. NativeServer::Stop arms it with the deadline it
// gives grpc::Server::Shutdown; at that deadline grpc cancels every call still running, so a
// call whose done notification says "cancelled" at or after it was cut by the stop (a client
// that went away earlier was done earlier). The frontend then exits with
// ipc.handshake.CALLS_CUT_EXIT and the supervisor logs 2.51's "Exit timeout expired" and exits
// 1 (frontend/main.py _drain, supervisor/main.py _stop_all).
// Arm runs on Stop's thread, OnDone on the completion-queue thread: atomics, and the deadline
// is written before `armed_` is released.
#ifndef TRITON_MP_NATIVE_STOP_CUT_H_
#define TRITON_MP_NATIVE_STOP_CUT_H_

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

namespace triton_mp {

class StopCut {
 public:
  // The stop begins: returns Shutdown's deadline, grace_s from now on gRPC's monotonic clock
  // (the clock Shutdown waits on, so "at or after" is exact).
  gpr_timespec Arm(double grace_s) {
    deadline_ = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                             gpr_time_from_micros(static_cast<int64_t>(grace_s * 1e6),
                                                  GPR_TIMESPAN));
    armed_.store(true, std::memory_order_release);
    return deadline_;
  }

  // A call's done notification (its OnDone); `ctx` is that call's. Before a stop this is one
  // atomic load.
  void OnDone(const grpc::ServerContextBase& ctx) {
    if (!armed_.load(std::memory_order_acquire)) return;
    if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline_) < 0) return;
    if (ctx.IsCancelled()) cut_.store(true, std::memory_order_relaxed);
  }

  // Whether a call was cut (read once the completion-queue thread has joined).
  bool cut() const { return cut_.load(std::memory_order_relaxed); }

 private:
  gpr_timespec deadline_{};
  std::atomic<bool> armed_{false};
  std::atomic<bool> cut_{false};
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_STOP_CUT_H_
