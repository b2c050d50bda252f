// RingProducer (ring_producer.h): Ring.push of ipc/memory/ring.py, under a lock.
#include "ring_producer.h"

#include <cstring>

namespace triton_mp {

namespace {

uint64_t* Word(unsigned char* base, uint64_t at) {
  return reinterpret_cast<uint64_t*>(base + at);
}

}  // namespace

bool RingProducer::Check(const unsigned char* base, uint64_t bytes, uint64_t* capacity) {
  if (bytes < kRingDataAt) return false;
  uint32_t magic;
  std::memcpy(&magic, base, sizeof magic);
  std::memcpy(capacity, base + 8, sizeof *capacity);
  return magic == kRingMagic && *capacity % 8 == 0 && *capacity <= bytes - kRingDataAt;
}

PushResult RingProducer::Push(const void* data, size_t n) {
  const uint64_t need = (4 + static_cast<uint64_t>(n) + 7) & ~uint64_t{7};
  const uint64_t cap = capacity_;
  if (need > cap / 2) return PushResult::kTooLarge;
  std::lock_guard<std::mutex> lock(mu_);
  unsigned char* base = base_;
  if (base == nullptr) return PushResult::kDetached;
  // NOTE: tail is ours (every producer pushes under mu_); head is the consumer's, read once.
  uint64_t tail = __atomic_load_n(Word(base, kRingTailAt), __ATOMIC_RELAXED);
  const uint64_t head = __atomic_load_n(Word(base, kRingHeadAt), __ATOMIC_ACQUIRE);
  uint64_t pos = tail % cap;
  const uint64_t room_to_end = cap - pos;
  const uint64_t skip = need > room_to_end ? room_to_end : 0;
  if ((tail - head) + skip + need > cap) return PushResult::kFull;
  if (skip != 0) {
    if (room_to_end >= 4) std::memcpy(base + kRingDataAt + pos, &kRingWrap, 4);
    tail += skip;
    pos = 0;
  }
  unsigned char* at = base + kRingDataAt + pos;
  const uint32_t length = static_cast<uint32_t>(n);
  std::memcpy(at, &length, 4);
  if (n != 0) std::memcpy(at + 4, data, n);
  // NOTE: the record before tail (release): the consumer that reads tail sees it whole.
  __atomic_store_n(Word(base, kRingTailAt), tail + need, __ATOMIC_RELEASE);
  return PushResult::kPushed;
}

uint64_t RingProducer::QuietWord() {
  std::lock_guard<std::mutex> lock(mu_);
  if (base_ == nullptr) return 0;
  // NOTE: Dekker's protocol (ipc.memory.notify): our tail store, a full barrier, then the
  // consumer's word; a consumer that clears a bit fences and rechecks its rings.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return __atomic_load_n(Word(base_, kRingQuietAt), __ATOMIC_ACQUIRE);
}

uint64_t RingProducer::QuietAndForming(uint64_t* mask, uint64_t* allowance, uint64_t* floor_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  *mask = *allowance = *floor_ns = 0;
  if (base_ == nullptr) return 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);  // NOTE: QuietWord's, and the forming words after it
  const uint64_t quiet = __atomic_load_n(Word(base_, kRingQuietAt), __ATOMIC_ACQUIRE);
  *mask = __atomic_load_n(Word(base_, kRingFormingAt), __ATOMIC_ACQUIRE);
  *allowance = __atomic_load_n(Word(base_, kRingFormingAt + 8), __ATOMIC_ACQUIRE);
  *floor_ns = __atomic_load_n(Word(base_, kRingFormingAt + 16), __ATOMIC_ACQUIRE);
  return quiet;
}

void RingProducer::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  base_ = nullptr;
}

}  // namespace triton_mp
