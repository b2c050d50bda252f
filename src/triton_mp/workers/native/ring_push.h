// One record appended to an ipc ring mapped in this process, by its single producer: the
// worker's answer writer pushes a batch's AnswerBatch straight into its frontend's ring.
//
// Python twin: Ring.push in src/triton_mp/ipc/memory/ring.py, whose module docstring is the
// layout (little-endian): 0 u32 magic RING_MAGIC, 4 u32 version, 8 u64 capacity (data bytes, a
// multiple of 8); 64 u64 tail (bytes ever written, producer only), 128 u64 head (bytes ever
// consumed, consumer only); 192 the data area. A record is u32 length + payload, padded to 8
// bytes; it never wraps: when it does not fit before the end, WRAP is written as the length
// (when at least 4 bytes remain) and the record starts at the data area's start. A record of
// more than half the capacity never fits. Like Ring.push it keeps no state: tail and head are
// read from the ring at each push, so Python's pushes and these interleave under the worker's
// post lock (one producer at a time). tests/unit/test_answer_plain.py compares every byte
// with Ring.push. (The frontend's locked twin is frontend/native/ring_producer.h.)
#ifndef TRITON_MP_WORKERS_NATIVE_RING_PUSH_H_
#define TRITON_MP_WORKERS_NATIVE_RING_PUSH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace triton_mp {

enum class RingPush : int { kPushed = 0, kFull = 1, kTooLarge = 2, kNotARing = 3 };

inline constexpr uint32_t kPushRingMagic = 0x54524E47;  // ring.py RING_MAGIC, "TRNG"
inline constexpr uint64_t kPushTailAt = 64;             // ring.py TAIL_OFFSET
inline constexpr uint64_t kPushHeadAt = 128;            // ring.py HEAD_OFFSET
inline constexpr uint64_t kPushDataAt = 192;            // ring.py DATA_OFFSET
inline constexpr uint32_t kPushWrap = 0xFFFFFFFF;       // ring.py WRAP

// Append the n bytes at data to the ring mapped at base (`bytes` long, writable). Nothing is
// written unless kPushed: a full ring (the caller waits as Sender._push does), a record that
// can never fit (RecordTooLarge), or a mapping that holds no ring.
inline RingPush PushRecord(unsigned char* base, uint64_t bytes, const void* data, size_t n) {
  if (bytes < kPushDataAt || reinterpret_cast<uintptr_t>(base) % 8 != 0) return RingPush::kNotARing;
  uint32_t magic;
  uint64_t cap;
  std::memcpy(&magic, base, sizeof magic);
  std::memcpy(&cap, base + 8, sizeof cap);
  if (magic != kPushRingMagic || cap == 0 || cap % 8 != 0 || cap > bytes - kPushDataAt) {
    return RingPush::kNotARing;
  }
  const uint64_t need = (4 + static_cast<uint64_t>(n) + 7) & ~uint64_t{7};
  if (need > cap / 2) return RingPush::kTooLarge;
  auto* tail_word = reinterpret_cast<uint64_t*>(base + kPushTailAt);
  auto* head_word = reinterpret_cast<uint64_t*>(base + kPushHeadAt);
  uint64_t tail = __atomic_load_n(tail_word, __ATOMIC_RELAXED);  // NOTE: ours (one producer)
  const uint64_t head = __atomic_load_n(head_word, __ATOMIC_ACQUIRE);
  uint64_t pos = tail % cap;
  const uint64_t room_to_end = cap - pos;
  const uint64_t skip = need > room_to_end ? room_to_end : 0;
  if ((tail - head) + skip + need > cap) return RingPush::kFull;
  if (skip != 0) {
    if (room_to_end >= 4) std::memcpy(base + kPushDataAt + pos, &kPushWrap, 4);
    tail += skip;
    pos = 0;
  }
  unsigned char* at = base + kPushDataAt + pos;
  const uint32_t length = static_cast<uint32_t>(n);
  std::memcpy(at, &length, 4);
  if (n != 0) std::memcpy(at + 4, data, n);
  // NOTE: the record before tail (release): a consumer that reads tail sees it whole.
  __atomic_store_n(tail_word, tail + need, __ATOMIC_RELEASE);
  return RingPush::kPushed;
}

}  // namespace triton_mp

#endif  // TRITON_MP_WORKERS_NATIVE_RING_PUSH_H_
