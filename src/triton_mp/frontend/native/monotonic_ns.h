// CLOCK_MONOTONIC in nanoseconds, the clock of Python's time.monotonic_ns: the arrival times
// the native path writes into request records (ipc/records.h arrival_ns), the deadlines of
// its ring pushes, and the short timed polls of its threads (answer_thread.cc PollEarly,
// answer_borrow.cc, handoff.cc LockStep). One definition for all of them.
#ifndef TRITON_MP_FRONTEND_NATIVE_MONOTONIC_NS_H_
#define TRITON_MP_FRONTEND_NATIVE_MONOTONIC_NS_H_

#include <time.h>

#include <cstdint>

namespace triton_mp {

inline uint64_t MonotonicNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ULL + static_cast<uint64_t>(t.tv_nsec);
}

// The same clock as a signed count, for the timed polls' differences and limits.
inline int64_t NowNs() { return static_cast<int64_t>(MonotonicNs()); }

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_MONOTONIC_NS_H_
