// The client system shared-memory regions of the known calls the gRPC thread submits
// (known_submit.h): which tensor entries of a lesson's REQUEST record name a window in a
// client's region (their offsets are the window's, the same for every call: never patched
// from the block), which regions a call holds (one region id per tensor naming one, inputs
// then outputs), and the uses those holds count until the call's answer or its hand-over to
// Python.
//
// Python twins: frontend/shm/system.py (SystemShmRegistry.hold / release / in_use: a region
// is in use from the acceptance of a request naming it until its final answer; its
// unregistration is refused meanwhile, in Python's words; the uses counted here are added to
// Python's by in_use), dispatch/known_requests.py (write_known: a window is named, not
// copied), dispatch/known_lane.py (KnownLane.entry: a request naming a region is known only
// while the registrations stay as they were: its `generation`).
//
// Every registration change is told here before it is made (Changed: the generation moves
// and, in known_regions_py.cc, every lesson is forgotten under KnownSubmit's lock), so a
// lesson taught at another generation is never used, and once Changed returned no call is
// submitted by a lesson taught before it: Python's in_use then sees every hold.
// Thread-safe (its own mutex; KnownSubmit calls Admit and Hold under its lock).
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_REGIONS_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace triton_mp {

// An entry of LessonRegions::entries that is a raw input (copied into the block, its offset
// patched per call); any other value is a window's offset in a client's region.
inline constexpr uint64_t kRawEntry = ~0ULL;

using HeldRegions = std::shared_ptr<const std::vector<uint64_t>>;

// The region part of a lesson (empty: it names no client region).
struct LessonRegions {
  // Per input tensor entry of the record, in order: kRawEntry, or the window's offset.
  // Empty: every entry is a raw input.
  std::vector<uint64_t> entries;
  HeldRegions held;         // region ids the call holds (null: none)
  uint64_t generation = 0;  // KnownRegions::generation() it was taught at
};

class KnownRegions {
 public:
  // A registration change is about to be made (the lessons are forgotten by the caller).
  void Changed();
  uint64_t generation() const;
  // Whether a lesson with `regions` may submit now (taught at this generation, or names no
  // region).
  bool Admit(const LessonRegions& regions) const;
  // A call naming `held` was sent (Hold) / answered or handed to Python (Release).
  void Hold(const HeldRegions& held);
  void Release(const std::vector<uint64_t>& held);
  // Calls sent and not yet released that name `region_id`.
  uint64_t Uses(uint64_t region_id) const;
  // Total uses (tests, stats).
  uint64_t held() const;

  // The entry offsets of a call of `regions` with `n_raw` raw inputs at `raw_at` (absolute
  // offsets in the arena), into `out`. False: the entries do not name exactly n_raw raw
  // inputs (Teach refuses such a lesson).
  static bool Entries(const LessonRegions& regions, const uint64_t* raw_at, size_t n_raw,
                      std::vector<uint64_t>* out);

 private:
  mutable std::mutex mu_;
  uint64_t generation_ = 0;
  std::unordered_map<uint64_t, uint64_t> uses_;  // by region id
};

// The process's one KnownRegions (KnownSubmit and the answer side use it).
KnownRegions& TheKnownRegions();

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_REGIONS_H_
