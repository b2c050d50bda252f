// The producer end of one ipc ring, shared by threads: each push holds a std::mutex, so the
// Python thread and the gRPC completion-queue thread never race on the ring's tail (the ring
// itself stays single-producer: one push at a time).
//
// Python twin: Ring.push in src/triton_mp/ipc/memory/ring.py, whose module docstring is the
// layout (little-endian): 0 u32 magic RING_MAGIC, 4 u32 version, 8 u64 capacity (data bytes,
// a multiple of 8); 64 u64 tail (bytes ever written, producer only), 128 u64 head (bytes ever
// consumed, consumer only), 136 u64 quiet word (consumer writes, producer reads after a
// fence), 144 u64 x3 forming words (likewise: known_wake.h); 192 the data area. A record is
// u32 length + payload, padded to 8 bytes; it never wraps: when it does not fit before the
// end, WRAP is written as the length (when at least 4 bytes remain) and the record starts at
// the data area's start. A record of more than half the capacity never fits.
// The push itself is ipc/native/ring_push.h's AppendRecord (the worker's answer writer pushes
// through it too). tests/unit/test_ring_producer.py compares every byte with Ring.push.
#ifndef TRITON_MP_FRONTEND_NATIVE_RING_PRODUCER_H_
#define TRITON_MP_FRONTEND_NATIVE_RING_PRODUCER_H_

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "ring_layout.h"

namespace triton_mp {

enum class PushResult : int { kPushed = 0, kFull = 1, kTooLarge = 2, kDetached = 3 };

class RingProducer {
 public:
  // base: the ring's writable mapping, kept mapped until Detach(); capacity: its data bytes
  // (the caller checks the mapping with Check() first).
  RingProducer(unsigned char* base, uint64_t capacity) : base_(base), capacity_(capacity) {}
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;

  // Whether a mapping of `bytes` bytes at base holds a ring (its magic, and its capacity
  // within the mapping); its capacity in *capacity.
  static bool Check(const unsigned char* base, uint64_t bytes, uint64_t* capacity);

  // Append one record of n bytes (Ring.push), under the lock.
  PushResult Push(const void* data, size_t n);
  // Whether a record of n bytes can ever be pushed (Ring.fits: at most half the capacity).
  bool Fits(size_t n) const { return RingRecordBytes(n) <= capacity_ / 2; }
  // A full barrier, then the quiet word (HeldWakes' rule: read after the push); 0 once
  // detached.
  uint64_t QuietWord();
  // QuietWord, then the three forming words (Ring.forming: mask, allowance word, floor ns;
  // zeros once detached).
  uint64_t QuietAndForming(uint64_t* mask, uint64_t* allowance, uint64_t* floor_ns);
  // From now on Push answers kDetached and the mapping is never touched again (its owner
  // may unmap it once this returns).
  void Detach();

  uint64_t capacity() const { return capacity_; }

 private:
  std::mutex mu_;
  unsigned char* base_;  // guarded by mu_; nullptr once detached
  const uint64_t capacity_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_RING_PRODUCER_H_
