// KnownRegions (known_regions.h).
#include "known_regions.h"

namespace triton_mp {

KnownRegions& TheKnownRegions() {
  static KnownRegions regions;
  return regions;
}

void KnownRegions::Changed() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
}

uint64_t KnownRegions::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

bool KnownRegions::Admit(const LessonRegions& regions) const {
  if (!regions.held) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return regions.generation == generation_;
}

void KnownRegions::Hold(const HeldRegions& held) {
  if (!held) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : *held) ++uses_[id];
}

void KnownRegions::Release(const std::vector<uint64_t>& held) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : held) {
    auto it = uses_.find(id);
    if (it == uses_.end()) continue;  // NOTE: never held here (Python's twin ignores it too)
    if (--it->second == 0) uses_.erase(it);
  }
}

uint64_t KnownRegions::Uses(uint64_t region_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = uses_.find(region_id);
  return it == uses_.end() ? 0 : it->second;
}

uint64_t KnownRegions::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, uses] : uses_) n += uses;
  return n;
}

bool KnownRegions::Entries(const LessonRegions& regions, const uint64_t* raw_at, size_t n_raw,
                           std::vector<uint64_t>* out) {
  if (regions.entries.empty()) {
    out->assign(raw_at, raw_at + n_raw);
    return true;
  }
  out->resize(regions.entries.size());
  size_t raw = 0;
  for (size_t i = 0; i < regions.entries.size(); ++i) {
    const uint64_t e = regions.entries[i];
    if (e != kRawEntry) {
      (*out)[i] = e;
      continue;
    }
    if (raw == n_raw) return false;
    (*out)[i] = raw_at[raw++];
  }
  return raw == n_raw;
}

}  // namespace triton_mp
