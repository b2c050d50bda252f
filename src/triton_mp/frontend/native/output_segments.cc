// See output_segments.h.
#include "output_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "input_arena.h"

namespace triton_mp {

OutputSegments::~OutputSegments() { Drop(); }

void OutputSegments::Drop() {
  for (auto& [name, m] : segments_) {
    if (m.base != nullptr) munmap(const_cast<unsigned char*>(m.base), m.bytes);
    if (m.fd >= 0) close(m.fd);
  }
  segments_.clear();
}

OutputSegments::Mapped* OutputSegments::Get(std::string_view name) {
  name_.assign(name);
  auto it = segments_.find(name_);
  if (it != segments_.end()) return &it->second;
  // NOTE: O_RDWR for the descriptor's frees; the mapping is read-only (tensor_pool's rule:
  // a stray store into another process's arena faults here, not there)
  const int fd = shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
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
  Mapped& m = segments_[name_];
  m.fd = fd;
  m.base = static_cast<const unsigned char*>(base);
  m.bytes = bytes;
  return &m;
}

const unsigned char* OutputSegments::View(std::string_view name, uint64_t offset, uint64_t n) {
  Mapped* m = Get(name);
  if (m == nullptr || offset > m->bytes || n > m->bytes - offset) return nullptr;
  return m->base + offset;
}

bool OutputSegments::Free(std::string_view name, uint64_t offset, uint64_t generation) {
  Mapped* m = Get(name);
  if (m == nullptr || offset % 4 != 0 || offset > m->bytes || m->bytes - offset < 8) {
    return false;
  }
  const uint32_t state = __atomic_load_n(reinterpret_cast<const uint32_t*>(m->base + offset),
                                         __ATOMIC_ACQUIRE);
  uint32_t gen;
  std::memcpy(&gen, m->base + offset + 4, sizeof gen);
  if (state != kBlockLive || (generation != 0 && gen != generation)) return false;
  const uint32_t free_state = kBlockFree;
  return pwrite(m->fd, &free_state, sizeof free_state, static_cast<off_t>(offset)) ==
         static_cast<ssize_t>(sizeof free_state);
}

}  // namespace triton_mp
