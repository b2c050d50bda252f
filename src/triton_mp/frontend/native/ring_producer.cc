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
  return RingCapacity(base, bytes, capacity);
}

PushResult RingProducer::Push(const void* data, size_t n) {
  if (!Fits(n)) return PushResult::kTooLarge;
  std::lock_guard<std::mutex> lock(mu_);
  if (base_ == nullptr) return PushResult::kDetached;
  // NOTE: tail is ours (every producer pushes under mu_); head is the consumer's, read once.
  return AppendRecord(base_, capacity_, data, n) == RingPush::kPushed ? PushResult::kPushed
                                                                        : PushResult::kFull;
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
