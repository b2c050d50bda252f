// One record appended to an ipc ring mapped in this process, by its one producer at a time:
// the frontend's RingProducer (frontend/native/ring_producer.h, under its lock) and the
// worker's answer writer (workers/native/answer_writer.cc, under the worker's post lock, taking
// turns with Python's pushes) both push through AppendRecord.
//
// Python twin: Ring.push in src/triton_mp/ipc/memory/ring.py, whose module docstring is the
// layout (little-endian): 0 u32 magic RING_MAGIC, 4 u32 version, 8 u64 capacity (data bytes, a
// multiple of 8); 64 u64 tail (bytes ever written, producer only), 128 u64 head (bytes ever
// consumed, consumer only); 192 the data area (the words between, the frontend's rings' quiet
// and forming words, are in frontend/native/ring_layout.h). A record is u32 length + payload,
// padded to 8 bytes; it never wraps: when it does not fit before the end, WRAP is written as
// the length (when at least 4 bytes remain) and the record starts at the data area's start. A
// record of more than half the capacity never fits. Like Ring.push it keeps no state: tail and
// head are read from the ring at each push. tests/unit/test_ring_producer.py and
// tests/unit/test_answer_plain.py compare every byte with Ring.push.
#ifndef TRITON_MP_IPC_NATIVE_RING_PUSH_H_
#define TRITON_MP_IPC_NATIVE_RING_PUSH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace triton_mp {

inline constexpr uint32_t kRingMagic = 0x54524E47;  // ring.py RING_MAGIC, "TRNG"
inline constexpr uint64_t kRingTailAt = 64;         // ring.py TAIL_OFFSET
inline constexpr uint64_t kRingHeadAt = 128;        // ring.py HEAD_OFFSET
inline constexpr uint64_t kRingDataAt = 192;        // ring.py DATA_OFFSET
inline constexpr uint32_t kRingWrap = 0xFFFFFFFF;   // ring.py WRAP

enum class RingPush : int { kPushed = 0, kFull = 1, kTooLarge = 2, kNotARing = 3 };

// Whether a mapping of `bytes` bytes at base holds a ring (its magic, and its capacity a
// multiple of 8 within the mapping); its capacity in *capacity.
inline bool RingCapacity(const unsigned char* base, uint64_t bytes, uint64_t* capacity) {
  if (bytes < kRingDataAt) return false;
  uint32_t magic;
  std::memcpy(&magic, base, sizeof magic);
  std::memcpy(capacity, base + 8, sizeof *capacity);
  return magic == kRingMagic && *capacity % 8 == 0 && *capacity <= bytes - kRingDataAt;
}

// The ring bytes a record of n payload bytes takes (Ring.fits: at most half the capacity).
inline uint64_t RingRecordBytes(size_t n) {
  return (4 + static_cast<uint64_t>(n) + 7) & ~uint64_t{7};
}

// Append the n bytes at data to the ring at base, whose capacity RingCapacity read. Nothing
// is written unless kPushed: a full ring (the caller waits, as Sender._push does) or a record
// that can never fit (RecordTooLarge).
inline RingPush AppendRecord(unsigned char* base, uint64_t cap, const void* data, size_t n) {
  const uint64_t need = RingRecordBytes(n);
  if (need > cap / 2) return RingPush::kTooLarge;
  auto* tail_word = reinterpret_cast<uint64_t*>(base + kRingTailAt);
  auto* head_word = reinterpret_cast<uint64_t*>(base + kRingHeadAt);
  uint64_t tail = __atomic_load_n(tail_word, __ATOMIC_RELAXED);  // NOTE: ours (one producer)
  const uint64_t head = __atomic_load_n(head_word, __ATOMIC_ACQUIRE);
  uint64_t pos = tail % cap;
  const uint64_t room_to_end = cap - pos;
  const uint64_t skip = need > room_to_end ? room_to_end : 0;
  if ((tail - head) + skip + need > cap) return RingPush::kFull;
  if (skip != 0) {
    if (room_to_end >= 4) std::memcpy(base + kRingDataAt + pos, &kRingWrap, 4);
    tail += skip;
    pos = 0;
  }
  unsigned char* at = base + kRingDataAt + pos;
  const uint32_t length = static_cast<uint32_t>(n);
  std::memcpy(at, &length, 4);
  if (n != 0) std::memcpy(at + 4, data, n);
  // NOTE: the record before tail (release): a consumer that reads tail sees it whole.
  __atomic_store_n(tail_word, tail + need, __ATOMIC_RELEASE);
  return RingPush::kPushed;
}

// AppendRecord on a mapping not checked yet (the worker's answer writer maps its frontend's
// ring per call): kNotARing for a mapping that holds no ring or is not 8-byte aligned.
inline RingPush PushRecord(unsigned char* base, uint64_t bytes, const void* data, size_t n) {
  uint64_t cap;
  if (reinterpret_cast<uintptr_t>(base) % 8 != 0 || !RingCapacity(base, bytes, &cap) ||
      cap == 0) {
    return RingPush::kNotARing;
  }
  return AppendRecord(base, cap, data, n);
}

}  // namespace triton_mp

#endif  // TRITON_MP_IPC_NATIVE_RING_PUSH_H_
