// A known unary ModelInfer submitted without Python: the request's key (request_split.h) looked
// up in the lessons Python taught, its id and raw entry sizes checked against the lesson, a
// block taken in the newest input arena (ArenaBlocks, shared with Python's ArenaAllocator),
// the raw bytes copied in, the lesson's REQUEST record template patched (record_patch.h), then
// handed straight to an idle instance of its version when the scheduler offers one and the
// lesson names its version's routes (direct_handoff.h, dispatch/direct.py's rules), else
// pushed into the scheduler's ring (RingProducer, shared with Python's pushes) and the
// scheduler woken as known_wake.h decides (HeldWakes' rule: the quiet word, the forming
// allowance, no post while one is pending). Anything that does not match
// a lesson, or finds no id, no room or a full ring, is left to Python (nothing was done).
//
// Python twins (every decision is Python's, taught here; nothing is decided twice):
// frontend/dispatch/known_lane.py (KnownLane.entry: the byte sizes), known_requests.py
// (write_known: the block's layout, each raw input 64-byte aligned from the payload start,
// the payload at block + 64), known_records.py (the template of a form: segment + client id),
// dispatch/pending.py (PendingTable.reserve: the request ids handed out in bulk).
// Thread-safe: every call holds the object's mutex (the gRPC thread submits, the Python
// thread teaches and clears), except a submit's copy of the raw bytes (Reserve, CopyInputs,
// Finish), which runs without it: so a 1 MiB copy never holds up the Python thread nor
// the answer thread, and Detach and SetArena wait for the copies in flight.
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_SUBMIT_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_SUBMIT_H_

#include <semaphore.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "deferred_post.h"
#include "input_arena.h"
#include "known_regions.h"
#include "request_split.h"
#include "ring_producer.h"

namespace triton_mp {

// What Python taught for one key (a form: the newest arena's segment; any request id: the
// template is kept without its client id, and each call's own id is written in,
// record_patch.h WithClientId).
struct KnownLesson {
  uint64_t id = 0;                 // Python's lesson id (never 0): the registration's
  std::string client_id;           // the request id's bytes the template was made for
  std::vector<uint64_t> sizes;     // each raw input's byte size, in order
  std::vector<uint64_t> at;        // each raw input's offset from the block's payload start
  uint64_t block_bytes = 0;        // the block, its 64-byte header included
  std::string record;              // the REQUEST record template of the form
  uint64_t bit = 0;                // its quiet-word bit (0: always wake)
  LessonRegions regions;           // its windows in clients' regions (known_regions.h)
  std::string route;               // its version's direct routes (direct_handoff.h), or ""
};

// What was sent for one submitted call (Python registers it: handoff.py KNOWN).
struct KnownSent {
  uint64_t request_id = 0;
  uint64_t lesson_id = 0;
  uint64_t offset = 0;      // the input block's offset in the arena segment
  uint32_t generation = 0;  // its generation
  uint64_t epoch = 0;       // the arena's (KnownSubmit::FreeInput)
  uint64_t copied = 0;      // raw input bytes copied into the block
  HeldRegions held;         // the client regions it holds (TheKnownRegions; null: none)
  std::string client_id;    // the call's request id (ModelInferRequest.id, UTF-8; "": none)
};

// A request id longer than this goes to Python (a record holds it whole).
inline constexpr size_t kKnownIdMaxBytes = 4096;

enum class KnownResult : int {
  kSent = 0,
  kUnknown = 1,   // no lesson for the key (or nothing to submit with)
  kDeclined = 2,  // a byte size differs from the lesson's, or the id is not UTF-8 or is
                  // over kKnownIdMaxBytes (Python refuses or takes it)
  kNoIds = 3,     // no request id left: Python hands more
  kNoRoom = 4,    // the newest arena has no room now: Python allocates (and grows)
  kFull = 5,      // the ring is full now (the block was freed)
  kStale = 6,     // the lesson names a client region and the registrations changed since
  kLost = 7,      // the direct handoff took a lease, then a ring stayed full (direct_handoff.h
                  // kLost; the block was freed): the call fails UNAVAILABLE, as Python's
                  // hand's ChannelTimeout (handoff.h kLost)
};

struct KnownStats {
  uint64_t sent = 0;
  uint64_t unknown = 0;
  uint64_t declined = 0;
  uint64_t no_ids = 0;
  uint64_t no_room = 0;
  uint64_t full = 0;
  uint64_t stale = 0;
  uint64_t wakes = 0;
  uint64_t cleared = 0;  // Clear() calls
};

inline constexpr size_t kKnownLessonsKept = 256;  // cleared whole when full (KnownRequests)

class KnownSubmit;

// One call between KnownSubmit::Reserve and Finish: its lesson, its input block (LIVE, this
// call's alone until pushed) and the arena's mapping the block lies in, which Detach and
// SetArena keep mapped until the reservation ends (Finish, or this object's end, which
// frees the block).
class KnownReservation {
 public:
  KnownReservation() = default;
  ~KnownReservation();
  KnownReservation(const KnownReservation&) = delete;
  KnownReservation& operator=(const KnownReservation&) = delete;

  bool held() const { return owner_ != nullptr; }

 private:
  friend class KnownSubmit;
  KnownSubmit* owner_ = nullptr;  // non-null: reserved, not yet ended
  std::shared_ptr<const KnownLesson> lesson_;
  unsigned char* base_ = nullptr;  // the arena's mapping when reserved
  uint64_t block_ = 0;
  uint32_t generation_ = 0;
  uint64_t epoch_ = 0;
  uint64_t lessons_version_ = 0;  // KnownSubmit::lessons_version_ when reserved
  std::string id_;  // the call's request id (UTF-8 checked)
};

class KnownSubmit {
 public:
  KnownSubmit() = default;
  ~KnownSubmit();
  KnownSubmit(const KnownSubmit&) = delete;
  KnownSubmit& operator=(const KnownSubmit&) = delete;

  // Python thread. The arena calls are allocated in (its mapping at base, of `bytes`, kept
  // mapped until the next SetArena or Detach); changing it clears every lesson.
  void SetArena(std::shared_ptr<ArenaBlocks> arena, unsigned char* base, uint64_t bytes);
  // The ring to the scheduler, and its wake-up semaphore (nullptr: never woken here).
  void SetRing(std::shared_ptr<RingProducer> ring, sem_t* wake);
  // Request ids [first, first + n) may be used (added to what is left).
  void AddIds(uint64_t first, uint64_t n);
  uint64_t ids_left() const;
  // Teach `key` for requests with any id (lesson.client_id: the id its record template was
  // made for; the template is kept without it). False: the lesson does not fit the arena or
  // its record (nothing kept).
  bool Teach(const std::string& key, KnownLesson lesson);
  // The lesson of `key` (any `client_id`) hands its calls to an idle instance of the version
  // whose routes are `route` (DirectRouteKey) when one is offered. False: no such lesson.
  bool SetRoute(const std::string& key, const std::string& client_id, const std::string& route);
  // Whether any lesson is kept (a cheap check before a call is split for Submit).
  bool taught() const { return taught_.load(std::memory_order_relaxed); }
  // Forget every lesson (un-teach).
  void Clear();
  // Forget the arena, the ring and the ids left: nothing is submitted any more (their owners
  // may unmap).
  void Detach();
  KnownStats stats() const;
  // Python thread: marks the input block of a call sent in arena epoch `epoch` FREE (its
  // answer was served: tensor_pool.free_block's rule, one aligned 4-byte store). False:
  // nothing written (the arena changed since, or the header holds another state or
  // generation).
  bool FreeInput(uint64_t epoch, uint64_t offset, uint32_t generation);
  uint64_t epoch() const {
    std::lock_guard<std::mutex> lock(mu_);
    return epoch_;
  }

  // Any thread: submit the call whose request is `message`, split as `split`, arrived at
  // `arrival_ns` (CLOCK_MONOTONIC). kSent fills `sent`. Reserve, CopyInputs, Finish.
  KnownResult Submit(const Chunks& message, const RequestSplit& split, uint64_t arrival_ns,
                     KnownSent* sent);

  // A submit in three steps (a caller holding its own lock across the push, Handoff::
  // SubmitKnown, holds it for Finish only). Reserve, under the object's lock: the lesson of
  // the request's key, its id and byte sizes checked, a block taken (kSent: `r` holds them;
  // else nothing was done). CopyInputs, with no lock held: the raw inputs copied into the
  // block (false: a range runs past the message, never after SplitInferRequest; `r` ended,
  // kDeclined). Finish,
  // under the lock: the record patched and handed or pushed (kSent fills `sent`); when the
  // arena or the lesson changed since Reserve the block is freed and the call is kUnknown.
  // `r` ends in Finish either way.
  KnownResult Reserve(const Chunks& message, const RequestSplit& split, KnownReservation* r);
  bool CopyInputs(const Chunks& message, const RequestSplit& split, KnownReservation* r);
  // A call handed to a worker leaves the worker's wake-up in `post`, posted when the caller
  // lets it go (after its own locks); without `post`, when Finish returns.
  KnownResult Finish(KnownReservation* r, const RequestSplit& split, uint64_t arrival_ns,
                     KnownSent* sent, DeferredPost* post = nullptr);
  // Reservations not yet ended (copies in flight).
  size_t reserved() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }

 private:
  friend class KnownReservation;
  KnownResult ReserveLocked(const Chunks& message, const RequestSplit& split,
                            KnownReservation* r);
  KnownResult FinishLocked(KnownReservation* r, const RequestSplit& split, uint64_t arrival_ns,
                           KnownSent* sent, DeferredPost* post);
  // Ends `r` (under mu_): its block freed unless `keep` (pushed), the waiters told.
  void EndLocked(KnownReservation* r, bool keep);
  // Waits (under `lock`, on mu_) until no reservation is in flight.
  void AwaitReservations(std::unique_lock<std::mutex>* lock);
  void Count(KnownResult result);

  void ForgetLocked();

  mutable std::mutex mu_;
  std::condition_variable ended_;  // a reservation ended (reserved_ fell)
  size_t reserved_ = 0;
  std::atomic<bool> taught_{false};
  // by the request's key (request_split.h: without its id); shared with the reservations
  // that use them (a lesson is replaced, never changed in place)
  std::unordered_map<std::string, std::shared_ptr<const KnownLesson>> lessons_;
  uint64_t lessons_version_ = 0;  // counts every change of lessons_
  std::shared_ptr<ArenaBlocks> arena_;
  uint64_t epoch_ = 0;  // SetArena and Detach count it: a block of another epoch is not ours
  unsigned char* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::shared_ptr<RingProducer> ring_;
  sem_t* wake_ = nullptr;
  std::vector<std::pair<uint64_t, uint64_t>> ids_;  // [first, end) ranges, oldest first
  std::string record_;  // the record being patched (reused)
  std::vector<uint64_t> entries_;
  std::vector<uint64_t> windows_;  // every entry's offset, windows included (reused)
  KnownStats stats_;
};

// The process's one KnownSubmit (the native server's handoff submits with it; Python teaches
// it through _native.known_*).
KnownSubmit& TheKnownSubmit();

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_SUBMIT_H_
