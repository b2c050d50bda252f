// The scheduler's wake-up after a known call the gRPC thread pushed (known_submit.h), decided
// by HeldWakes' rule with the call's rows counted against the scheduler's forming allowance.
//
// Python twins (one rule, two languages; tests/unit/test_known_wake.py draws the same cases for
// both and asserts they agree): frontend/dispatch/wakes.py (HeldWakes: `held` ends with
// `_end_held`, whose rule is HeldNeedsWake here; Allowance.join is FormingAllowance::Join),
// scheduler/forming.py (what the scheduler publishes and why a request may wait unread),
// ipc/recordio/quiet_requests.py (the buckets, the allowance word, the record's fields).
//
// The ring's words (ipc/memory/ring.py's layout; u64 little-endian; the consumer writes, the
// producer reads after its push and a full fence, RingProducer::QuietAndForming): 136 quiet word
// (model buckets whose every instance is busy), 144 forming mask (buckets whose batch forms in
// its delay), 152 allowance word (epoch u32 << 32 | rows u32), 160 floor (CLOCK_MONOTONIC ns:
// the earliest arrival a quiet request may carry). A REQUEST record's fields read here
// (ipc/recordio/record_layout.py): arrival_ns u64 at 16, batch_size u32 at 52.
//
// One KnownWake per process (TheKnownWake): each known call is decided as it is pushed (a held
// batch of one: HeldPushes / HeldNeedsWake keep the batch form of the rule, which the tests
// replay). Holding a completion-queue batch's calls to its end was tried and is not done: the
// end of a batch is only seen by polling the queue (AsyncNext with a past deadline), which cost
// c=1 ~17% of its throughput. Python's own pushes on the same ring count their forming rows in
// the same allowance (known_wake_join), so the two producers together never push more rows
// quietly than the scheduler allowed.
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_WAKE_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_WAKE_H_

#include <semaphore.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ring_producer.h"

namespace triton_mp {

inline constexpr int kAllowanceEpochShift = 32;               // quiet_requests.EPOCH_SHIFT
inline constexpr uint64_t kAllowanceRowsMask = 0xFFFFFFFFull;  // quiet_requests.ROWS_MASK
inline constexpr size_t kRecordArrivalAt = 16;                 // REQUEST arrival_ns (u64)
inline constexpr size_t kRecordRowsAt = 52;                    // REQUEST batch_size (u32)

// The ring's forming words (Ring.forming: mask, allowance word, floor ns).
struct FormingWords {
  uint64_t mask = 0;
  uint64_t allowance = 0;
  uint64_t floor_ns = 0;
};

// wakes.Allowance: one producer's count of the rows it pushed into forming batches without a
// wake-up, per epoch of the allowance word.
class FormingAllowance {
 public:
  // Whether requests of buckets `bits`, `rows` rows in all, the earliest stamped `first_ns`,
  // may go without a wake-up under `words`; counts their rows when they may. An epoch older
  // than the one counted is refused (two threads read the words in either order).
  bool Join(uint64_t bits, uint64_t rows, uint64_t first_ns, const FormingWords& words);
  int64_t epoch() const { return epoch_; }
  uint64_t used() const { return used_; }

 private:
  int64_t epoch_ = -1;  // -1: none seen (the first epoch seen counts as spent)
  uint64_t used_ = 0;
};

// What a held batch pushed (HeldWakes' _owed, _bits, _rows, _first_ns).
struct HeldPushes {
  bool owed = false;      // a record that must wake (bit 0)
  uint64_t bits = 0;      // the buckets of the requests that may not
  uint64_t rows = 0;      // their rows
  uint64_t first_ns = 0;  // their earliest arrival (0: none)

  void Add(uint64_t bit, uint64_t rows, uint64_t arrival_ns);
  bool empty() const { return !owed && bits == 0; }
};

// HeldWakes._end_held's rule: whether `held` needs a wake-up given the quiet word and the
// forming words read after its pushes; counts its rows in `allowance` when they join.
bool HeldNeedsWake(const HeldPushes& held, uint64_t quiet, const FormingWords& words,
                   FormingAllowance* allowance);

class KnownWake {
 public:
  KnownWake() = default;
  KnownWake(const KnownWake&) = delete;
  KnownWake& operator=(const KnownWake&) = delete;

  // The ring to the scheduler and its semaphore (nullptr: never posted; the caller closes the
  // old semaphore after this).
  void SetRing(std::shared_ptr<RingProducer> ring, sem_t* wake);
  // One REQUEST record of `n` bytes was pushed (its bucket `bit`; 0: it must wake): post the
  // semaphore when HeldNeedsWake says so and no post is pending.
  void Pushed(uint64_t bit, const void* record, size_t n);
  // A Python push's forming rows (HeldWakes' join), counted in the same allowance.
  bool Join(uint64_t bits, uint64_t rows, uint64_t first_ns, const FormingWords& words);
  uint64_t posts() const;

 private:
  void DecideLocked(const HeldPushes& held);  // HeldNeedsWake, and the post

  mutable std::mutex mu_;
  std::shared_ptr<RingProducer> ring_;
  sem_t* wake_ = nullptr;
  FormingAllowance allowance_;
  uint64_t posts_ = 0;
};

// The process's one KnownWake (its one ring to the scheduler).
KnownWake& TheKnownWake();

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_WAKE_H_
