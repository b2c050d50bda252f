// See output_segments.h.
#include "output_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "input_arena.h"

namespace triton_mp {

namespace {

constexpr uint64_t kHolderOffset = 16;  // u32 holder, then u32 flags (ipc/output_holds.py)
constexpr uint32_t kBlockCopy = 1;      // flags: copy, never hold (output_holds.COPY)

}  // namespace

std::shared_ptr<const SegmentMapping> SegmentMapping::Open(const std::string& name) {
  // NOTE: O_RDWR for the descriptor's frees; the mapping is read-only (tensor_pool's rule:
  // a stray store into another process's arena faults here, not there)
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return nullptr;
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  return std::make_shared<const SegmentMapping>(Opened{}, fd,
                                                static_cast<const unsigned char*>(base), bytes);
}

SegmentMapping::~SegmentMapping() {
  munmap(const_cast<unsigned char*>(base_), bytes_);
  close(fd_);
}

const unsigned char* SegmentMapping::View(uint64_t offset, uint64_t n) const {
  if (offset > bytes_ || n > bytes_ - offset) return nullptr;
  return base_ + offset;
}

uint64_t SegmentMapping::BlockPayload(uint64_t offset) const {
  if (offset % 8 != 0 || offset > bytes_ || bytes_ - offset < kArenaHeaderBytes) return 0;
  uint64_t block_bytes;
  std::memcpy(&block_bytes, base_ + offset + 8, sizeof block_bytes);
  if (block_bytes < kArenaHeaderBytes || block_bytes > bytes_ - offset) return 0;
  return block_bytes - kArenaHeaderBytes;
}

bool SegmentMapping::Free(uint64_t offset, uint64_t generation) const {
  if (offset % 4 != 0 || offset > bytes_ || bytes_ - offset < 8) return false;
  const uint32_t state =
      __atomic_load_n(reinterpret_cast<const uint32_t*>(base_ + offset), __ATOMIC_ACQUIRE);
  uint32_t gen;
  std::memcpy(&gen, base_ + offset + 4, sizeof gen);
  if (state != kBlockLive || (generation != 0 && gen != generation)) return false;
  const uint32_t free_state = kBlockFree;
  return pwrite(fd_, &free_state, sizeof free_state, static_cast<off_t>(offset)) ==
         static_cast<ssize_t>(sizeof free_state);
}

bool SegmentMapping::Hold(uint64_t offset, uint64_t generation, uint32_t holder) const {
  if (offset % 8 != 0 || offset > bytes_ || bytes_ - offset < kArenaHeaderBytes) return false;
  const uint32_t state =
      __atomic_load_n(reinterpret_cast<const uint32_t*>(base_ + offset), __ATOMIC_ACQUIRE);
  uint32_t gen;
  std::memcpy(&gen, base_ + offset + 4, sizeof gen);
  if (state != kBlockLive || gen != generation) return false;
  return pwrite(fd_, &holder, sizeof holder, static_cast<off_t>(offset + kHolderOffset)) ==
         static_cast<ssize_t>(sizeof holder);
}

bool SegmentMapping::MayHold(uint64_t offset) const {
  if (offset % 8 != 0 || offset > bytes_ || bytes_ - offset < kArenaHeaderBytes) return false;
  uint32_t flags;
  std::memcpy(&flags, base_ + offset + kHolderOffset + 4, sizeof flags);
  return (flags & kBlockCopy) == 0;
}

const std::shared_ptr<const SegmentMapping>& OutputSegments::Get(std::string_view name) {
  name_.assign(name);
  auto it = segments_.find(name_);
  if (it != segments_.end()) return it->second;
  std::shared_ptr<const SegmentMapping> m = SegmentMapping::Open(name_);
  if (!m) return none_;
  return segments_.emplace(name_, std::move(m)).first->second;
}

const unsigned char* OutputSegments::View(std::string_view name, uint64_t offset, uint64_t n) {
  const auto& m = Get(name);
  return m ? m->View(offset, n) : nullptr;
}

bool OutputSegments::Free(std::string_view name, uint64_t offset, uint64_t generation) {
  const auto& m = Get(name);
  return m && m->Free(offset, generation);
}

}  // namespace triton_mp
