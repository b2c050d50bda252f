// KnownSubmit (known_submit.h).
#include "known_submit.h"

#include <cstring>
#include <utility>

#include "direct_handoff.h"
#include "known_wake.h"
#include "record_patch.h"

namespace triton_mp {

namespace {

// Whether `s` is well-formed UTF-8 (Python's strict decode, protobuf's string check: no
// overlong form, no surrogate, nothing past U+10FFFF).
bool Utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    size_t more;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      more = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      more = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      more = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (n - i - 1 < more) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k <= more; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += more + 1;
  }
  return true;
}

}  // namespace

KnownSubmit::~KnownSubmit() = default;

KnownSubmit& TheKnownSubmit() {
  static KnownSubmit known;
  return known;
}

void KnownSubmit::ForgetLocked() {
  lessons_.clear();
  ++lessons_version_;
  taught_.store(false, std::memory_order_relaxed);
  ++stats_.cleared;
}

void KnownSubmit::AwaitReservations(std::unique_lock<std::mutex>* lock) {
  ended_.wait(*lock, [this] { return reserved_ == 0; });
}

void KnownSubmit::SetArena(std::shared_ptr<ArenaBlocks> arena, unsigned char* base,
                           uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  arena_ = std::move(arena);
  ++epoch_;
  base_ = base;
  bytes_ = bytes;
  ForgetLocked();  // NOTE: a lesson's template names the arena's segment
  // NOTE: its caller lets the old mapping go on return: no copy may still write into it
  // (and none starts before a lesson is taught again, on the caller's thread)
  AwaitReservations(&lock);
}

void KnownSubmit::SetRing(std::shared_ptr<RingProducer> ring, sem_t* wake) {
  std::lock_guard<std::mutex> lock(mu_);
  ring_ = std::move(ring);
  wake_ = wake;
  TheKnownWake().SetRing(ring_, wake);
}

void KnownSubmit::AddIds(uint64_t first, uint64_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ids_.emplace_back(first, first + n);
}

uint64_t KnownSubmit::ids_left() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& r : ids_) n += r.second - r.first;
  return n;
}

bool KnownSubmit::Teach(const std::string& key, KnownLesson lesson) {
  if (lesson.id == 0 || lesson.sizes.size() != lesson.at.size()) return false;
  std::vector<uint64_t> entries;  // NOTE: the windows name exactly the raw inputs between
  if (!KnownRegions::Entries(lesson.regions, lesson.at.data(), lesson.at.size(), &entries) ||
      lesson.record.size() < PatchedRecordMinBytes(entries.size())) {
    return false;
  }
  if (lesson.block_bytes < kArenaHeaderBytes || lesson.block_bytes % 64 != 0) return false;
  for (size_t i = 0; i < lesson.sizes.size(); ++i) {
    // NOTE: each input lies inside the block's payload (no overflow: both are below 2**63)
    if (lesson.at[i] > (1ULL << 62) || lesson.sizes[i] > (1ULL << 62) ||
        kArenaHeaderBytes + lesson.at[i] + lesson.sizes[i] > lesson.block_bytes) {
      return false;
    }
  }
  std::string bare;  // NOTE: the template without its id (each call's is written in)
  if (!WithClientId(lesson.record, "", 0, &bare)) return false;
  lesson.record = std::move(bare);
  std::lock_guard<std::mutex> lock(mu_);
  if (!arena_ || lesson.block_bytes > arena_->capacity()) return false;
  if (lessons_.size() >= kKnownLessonsKept) ForgetLocked();
  lessons_[key] = std::make_shared<const KnownLesson>(std::move(lesson));
  ++lessons_version_;
  taught_.store(true, std::memory_order_relaxed);
  return true;
}

bool KnownSubmit::SetRoute(const std::string& key, const std::string& /*client_id*/,
                           const std::string& route) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = lessons_.find(key);
  if (it == lessons_.end()) return false;
  // NOTE: replaced, not changed: a reservation may be reading the old one
  auto changed = std::make_shared<KnownLesson>(*it->second);
  changed->route = route;
  it->second = std::move(changed);
  ++lessons_version_;
  return true;
}

void KnownSubmit::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ForgetLocked();
}

void KnownSubmit::Detach() {
  std::unique_lock<std::mutex> lock(mu_);
  ForgetLocked();
  arena_.reset();
  ++epoch_;  // NOTE: a reservation in flight finds it moved (kUnknown) once its copy ends
  base_ = nullptr;
  bytes_ = 0;
  ring_.reset();
  wake_ = nullptr;
  TheKnownWake().SetRing(nullptr, nullptr);
  ids_.clear();
  // NOTE: its caller unmaps the arena on return: no copy may still write into it (and no
  // new one starts: nothing is reserved without an arena)
  AwaitReservations(&lock);
}

bool KnownSubmit::FreeInput(uint64_t epoch, uint64_t offset, uint32_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch != epoch_ || base_ == nullptr || offset % 4 != 0 || offset > bytes_ ||
      bytes_ - offset < kArenaHeaderBytes) {
    return false;
  }
  uint32_t* state = reinterpret_cast<uint32_t*>(base_ + offset);
  uint32_t gen;
  std::memcpy(&gen, base_ + offset + 4, sizeof gen);
  if (__atomic_load_n(state, __ATOMIC_ACQUIRE) != kBlockLive || gen != generation) return false;
  __atomic_store_n(state, kBlockFree, __ATOMIC_RELEASE);
  return true;
}

KnownStats KnownSubmit::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  KnownStats s = stats_;
  s.wakes = TheKnownWake().posts();
  return s;
}

KnownReservation::~KnownReservation() {
  if (owner_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_->mu_);
  owner_->EndLocked(this, false);
}

void KnownSubmit::EndLocked(KnownReservation* r, bool keep) {
  if (r->owner_ == nullptr) return;
  if (!keep) {
    // NOTE: ours alone until pushed: freed as its reader would (one aligned 4-byte store);
    // still mapped, as Detach and SetArena wait for this under mu_
    __atomic_store_n(reinterpret_cast<uint32_t*>(r->base_ + r->block_), kBlockFree,
                     __ATOMIC_RELEASE);
  }
  r->owner_ = nullptr;
  r->lesson_.reset();
  if (--reserved_ == 0) ended_.notify_all();
}

void KnownSubmit::Count(KnownResult result) {
  switch (result) {
    case KnownResult::kSent: ++stats_.sent; break;
    case KnownResult::kUnknown: ++stats_.unknown; break;
    case KnownResult::kDeclined: ++stats_.declined; break;
    case KnownResult::kNoIds: ++stats_.no_ids; break;
    case KnownResult::kNoRoom: ++stats_.no_room; break;
    case KnownResult::kFull: ++stats_.full; break;
    case KnownResult::kStale: ++stats_.stale; break;
    case KnownResult::kLost: ++stats_.full; break;
  }
}

KnownResult KnownSubmit::Submit(const Chunks& message, const RequestSplit& split,
                                uint64_t arrival_ns, KnownSent* sent) {
  KnownReservation r;
  KnownResult result = Reserve(message, split, &r);
  if (result != KnownResult::kSent) return result;
  if (!CopyInputs(message, split, &r)) return KnownResult::kDeclined;
  return Finish(&r, split, arrival_ns, sent);
}

KnownResult KnownSubmit::Reserve(const Chunks& message, const RequestSplit& split,
                                 KnownReservation* r) {
  std::lock_guard<std::mutex> lock(mu_);
  KnownResult result = ReserveLocked(message, split, r);
  if (result != KnownResult::kSent) Count(result);
  return result;
}

KnownResult KnownSubmit::ReserveLocked(const Chunks& message, const RequestSplit& split,
                                       KnownReservation* r) {
  if (!arena_ || !ring_ || base_ == nullptr) return KnownResult::kUnknown;
  auto it = lessons_.find(split.key);
  if (it == lessons_.end()) return KnownResult::kUnknown;
  const KnownLesson& lesson = *it->second;
  // NOTE: any id: written into the record and the response (KnownCalls.submit's rules)
  r->id_.clear();
  if (split.has_id && split.id.second != 0) {
    if (split.id.second > kKnownIdMaxBytes) return KnownResult::kDeclined;
    message.Append(split.id.first, split.id.second, &r->id_);
    if (!Utf8(r->id_)) return KnownResult::kDeclined;  // NOTE: protobuf refuses it in Python
  }
  if (!TheKnownRegions().Admit(lesson.regions)) return KnownResult::kStale;
  const size_t n = lesson.sizes.size();
  if (split.raw.size() < n) return KnownResult::kDeclined;  // surplus entries are ignored
  for (size_t i = 0; i < n; ++i) {
    if (split.raw[i].second != lesson.sizes[i]) return KnownResult::kDeclined;
  }
  while (!ids_.empty() && ids_.front().first == ids_.front().second) ids_.erase(ids_.begin());
  if (ids_.empty()) return KnownResult::kNoIds;
  const int64_t offset = arena_->TryAlloc(base_, lesson.block_bytes);
  if (offset < 0) return KnownResult::kNoRoom;
  r->owner_ = this;
  ++reserved_;
  r->lesson_ = it->second;
  r->base_ = base_;
  r->block_ = static_cast<uint64_t>(offset);
  std::memcpy(&r->generation_, base_ + r->block_ + 4, sizeof r->generation_);
  r->epoch_ = epoch_;
  r->lessons_version_ = lessons_version_;
  return KnownResult::kSent;
}

bool KnownSubmit::CopyInputs(const Chunks& message, const RequestSplit& split,
                             KnownReservation* r) {
  const KnownLesson& lesson = *r->lesson_;
  unsigned char* payload = r->base_ + r->block_ + kArenaHeaderBytes;
  for (size_t i = 0; i < lesson.sizes.size(); ++i) {
    // NOTE: within the block (Teach checked); the split found the entry in the message
    if (!message.Copy(split.raw[i].first, lesson.sizes[i], payload + lesson.at[i])) {
      std::lock_guard<std::mutex> lock(mu_);
      EndLocked(r, false);
      Count(KnownResult::kDeclined);
      return false;
    }
  }
  return true;
}

KnownResult KnownSubmit::Finish(KnownReservation* r, const RequestSplit& split,
                                uint64_t arrival_ns, KnownSent* sent, DeferredPost* post) {
  DeferredPost own;  // NOTE: declared before the lock: posted after it is released
  std::lock_guard<std::mutex> lock(mu_);
  KnownResult result = FinishLocked(r, split, arrival_ns, sent, post != nullptr ? post : &own);
  EndLocked(r, result == KnownResult::kSent);
  Count(result);
  return result;
}

KnownResult KnownSubmit::FinishLocked(KnownReservation* r, const RequestSplit& split,
                                      uint64_t arrival_ns, KnownSent* sent,
                                      DeferredPost* post) {
  // NOTE: Detach or SetArena since Reserve: the arena is going, with its lessons
  if (r->epoch_ != epoch_ || !ring_) return KnownResult::kUnknown;
  if (r->lessons_version_ != lessons_version_) {
    // NOTE: taught or forgotten since: sent only by the lesson its key has now
    auto it = lessons_.find(split.key);
    if (it == lessons_.end() || it->second != r->lesson_) return KnownResult::kUnknown;
  }
  const KnownLesson& lesson = *r->lesson_;
  if (!TheKnownRegions().Admit(lesson.regions)) return KnownResult::kStale;
  while (!ids_.empty() && ids_.front().first == ids_.front().second) ids_.erase(ids_.begin());
  if (ids_.empty()) return KnownResult::kNoIds;
  const size_t n = lesson.sizes.size();
  const uint64_t block = r->block_;
  entries_.resize(n);
  for (size_t i = 0; i < n; ++i) entries_[i] = block + kArenaHeaderBytes + lesson.at[i];
  const uint64_t rid = ids_.front().first;
  if (!WithClientId(lesson.record, r->id_.data(), r->id_.size(), &record_)) {
    return KnownResult::kDeclined;  // NOTE: never (Teach checked its layout)
  }
  // NOTE: with windows in clients' regions among the inputs, every entry in record order
  if (!KnownRegions::Entries(lesson.regions, entries_.data(), n, &windows_)) {
    return KnownResult::kDeclined;  // NOTE: never (Teach checked it)
  }
  RecordPatch patch{rid, arrival_ns, block, r->generation_, windows_.data(), windows_.size()};
  PatchRecord(reinterpret_cast<unsigned char*>(&record_[0]), record_.size(), patch);
  HandResult hand = HandResult::kNotHanded;
  if (!lesson.route.empty()) {
    // NOTE: Inference._send_request's order: an idle instance first, else the scheduler
    hand = TheDirectHandoff().Hand(lesson.route, rid, record_, ring_.get(), wake_, post);
    if (hand == HandResult::kLost) {
      // NOTE: its id may be in a DirectSent pushed already: never used again (the block
      // is freed by EndLocked)
      ++ids_.front().first;
      return KnownResult::kLost;
    }
  }
  // NOTE: a call handed goes without a scheduler wake (its DirectSent waits for a pass)
  if (hand != HandResult::kHanded &&
      ring_->Push(record_.data(), record_.size()) != PushResult::kPushed) {
    return KnownResult::kFull;  // NOTE: the block is freed by EndLocked
  }
  ++ids_.front().first;
  if (hand != HandResult::kHanded) {
    TheKnownWake().Pushed(lesson.bit, record_.data(), record_.size());  // known_wake.h
  }
  TheKnownRegions().Hold(lesson.regions.held);  // NOTE: before Clear can return (the lock)
  sent->held = lesson.regions.held;
  sent->request_id = rid;
  sent->lesson_id = lesson.id;
  sent->offset = block;
  sent->generation = r->generation_;
  sent->epoch = epoch_;
  sent->copied = 0;
  sent->client_id = std::move(r->id_);
  for (uint64_t size : lesson.sizes) sent->copied += size;
  return KnownResult::kSent;
}

}  // namespace triton_mp
