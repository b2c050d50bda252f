// KnownWake (known_wake.h): HeldWakes' rule for the gRPC thread's pushes.
#include "known_wake.h"

#include <cstring>
#include <utility>

namespace triton_mp {

bool FormingAllowance::Join(uint64_t bits, uint64_t rows, uint64_t first_ns,
                            const FormingWords& words) {
  if (bits == 0 || (bits & ~words.mask) != 0 || first_ns < words.floor_ns) return false;
  const int64_t epoch = static_cast<int64_t>(words.allowance >> kAllowanceEpochShift);
  const uint64_t allowed = words.allowance & kAllowanceRowsMask;
  if (epoch != epoch_) {
    if (epoch_ >= 0 && ((static_cast<uint64_t>(epoch_ - epoch) & kAllowanceRowsMask) >> 31) == 0) {
      return false;  // NOTE: older than the epoch counted (u32 serial order): a wake is safe
    }
    // NOTE: the first epoch seen counts as spent: a frontend that replaced a dead one on this
    // ring cannot know what that one pushed under it.
    used_ = epoch_ >= 0 ? 0 : allowed;
    epoch_ = epoch;
  }
  const uint64_t used = used_ + rows;
  if (used > allowed) return false;
  used_ = used;
  return true;
}

void HeldPushes::Add(uint64_t bit, uint64_t n, uint64_t arrival_ns) {
  if (bit == 0) {
    owed = true;
    return;
  }
  bits |= bit;
  rows += n;
  if (first_ns == 0 || arrival_ns < first_ns) first_ns = arrival_ns;
}

bool HeldNeedsWake(const HeldPushes& held, uint64_t quiet, const FormingWords& words,
                   FormingAllowance* allowance) {
  if (held.owed) return true;
  const uint64_t rest = held.bits & ~quiet;
  if (rest == 0) return false;
  // NOTE: the rows of requests the busy bits spared count too: an over-count only costs a
  // wake-up (HeldWakes._end_held).
  return !allowance->Join(rest, held.rows, held.first_ns, words);
}

KnownWake& TheKnownWake() {
  static KnownWake wake;
  return wake;
}

void KnownWake::SetRing(std::shared_ptr<RingProducer> ring, sem_t* wake) {
  std::lock_guard<std::mutex> lock(mu_);
  ring_ = std::move(ring);
  wake_ = wake;
}

void KnownWake::Pushed(uint64_t bit, const void* record, size_t n) {
  HeldPushes one;
  uint64_t arrival_ns = 0;
  uint32_t rows = 0;
  if (bit != 0 && n >= kRecordRowsAt + sizeof rows) {
    const unsigned char* at = static_cast<const unsigned char*>(record);
    std::memcpy(&arrival_ns, at + kRecordArrivalAt, sizeof arrival_ns);
    std::memcpy(&rows, at + kRecordRowsAt, sizeof rows);
  } else {
    bit = 0;  // NOTE: not a REQUEST record this rule can read: it wakes
  }
  one.Add(bit, rows, arrival_ns);
  std::lock_guard<std::mutex> lock(mu_);
  DecideLocked(one);
}

void KnownWake::DecideLocked(const HeldPushes& held) {
  if (held.empty() || !ring_ || wake_ == nullptr) return;
  FormingWords words;
  const uint64_t quiet = ring_->QuietAndForming(&words.mask, &words.allowance, &words.floor_ns);
  if (!HeldNeedsWake(held, quiet, words, &allowance_)) return;
  // NOTE: a post still pending (the value a plain load, no system call) announces these
  // records too: the scheduler takes its posts with atomic decrements and then reads its rings
  // (ipc.channel.Inbox.wait), so the post read here is taken after these pushes and the rings
  // read after that (Waker.wake's rule for an armed FIFO, notify.py).
  int pending = 0;
  if (sem_getvalue(wake_, &pending) != 0 || pending <= 0) {
    sem_post(wake_);
    ++posts_;
  }
}

bool KnownWake::Join(uint64_t bits, uint64_t rows, uint64_t first_ns, const FormingWords& words) {
  std::lock_guard<std::mutex> lock(mu_);
  return allowance_.Join(bits, rows, first_ns, words);
}

uint64_t KnownWake::posts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return posts_;
}

}  // namespace triton_mp
