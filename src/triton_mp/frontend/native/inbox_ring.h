// One ring of the frontend's inbox, mapped and consumed in C++ (the answer thread,
// answer_thread.h). Layout: ipc/memory/ring.py (its Python twin; the consumer side only:
// `head` is written here, `tail` and the records are read):
//
//     0   u32 magic (RING_MAGIC "TRNG")   4 u32 version   8 u64 capacity (data bytes)
//     64  u64 tail  (producer)            128 u64 head (consumer)
//     192 ... data: records of u32 length + payload padded to 8 bytes; WRAP (0xFFFFFFFF) as
//         the length, or fewer than 4 bytes left, sends the reader back to the start.
//
// The producer writes a record before it publishes `tail` (an aligned 8-byte store); the
// consumer reads a record before it publishes `head`. Not thread-safe: one consumer at a
// time (the answer thread, under its rings' lock).
#ifndef TRITON_MP_FRONTEND_NATIVE_INBOX_RING_H_
#define TRITON_MP_FRONTEND_NATIVE_INBOX_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ring_layout.h"

namespace triton_mp {

class InboxRing {
 public:
  // Maps the ring named `name` (a POSIX shared-memory name, leading slash or not); nullptr
  // when it does not exist or is not a ring.
  static std::unique_ptr<InboxRing> Attach(const std::string& name);
  ~InboxRing();
  InboxRing(const InboxRing&) = delete;
  InboxRing& operator=(const InboxRing&) = delete;

  // The name without its leading slash (Inbox._by_name's key).
  const std::string& name() const { return name_; }
  // Whether records are published and not consumed (two loads).
  bool has_records() const;
  // Calls fn(data, size) on each record published so far, oldest first, each read in place
  // (valid during the call); `head` is published after the last. Returns how many.
  template <typename Fn>
  size_t PopEach(Fn&& fn);

 private:
  InboxRing() = default;
  uint64_t* word(size_t offset) const { return reinterpret_cast<uint64_t*>(base_ + offset); }

  std::string name_;
  unsigned char* base_ = nullptr;
  size_t size_ = 0;
  uint64_t capacity_ = 0;
};


template <typename Fn>
size_t InboxRing::PopEach(Fn&& fn) {
  const uint64_t tail = __atomic_load_n(word(kRingTailAt), __ATOMIC_ACQUIRE);
  uint64_t head = __atomic_load_n(word(kRingHeadAt), __ATOMIC_RELAXED);
  size_t n = 0;
  while (head < tail) {
    const uint64_t pos = head % capacity_;
    const uint64_t room_to_end = capacity_ - pos;
    if (room_to_end < 4) {
      head += room_to_end;
      continue;
    }
    uint32_t len;
    __builtin_memcpy(&len, base_ + kRingDataAt + pos, 4);
    if (len == kRingWrap) {
      head += room_to_end;
      continue;
    }
    if (len > room_to_end - 4) break;  // NOTE: a damaged ring: stop, never read past its end
    fn(base_ + kRingDataAt + pos + 4, static_cast<size_t>(len));
    head += (4 + static_cast<uint64_t>(len) + 7) & ~uint64_t{7};
    ++n;
  }
  __atomic_store_n(word(kRingHeadAt), head, __ATOMIC_RELEASE);
  return n;
}

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_INBOX_RING_H_
