// See inbox_ring.h.
#include "inbox_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace triton_mp {

std::unique_ptr<InboxRing> InboxRing::Attach(const std::string& name) {
  const std::string bare = name.empty() || name[0] != '/' ? name : name.substr(1);
  const std::string posix = "/" + bare;
  const int fd = shm_open(posix.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  struct stat st;
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kRingDataAt) {
    base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  std::unique_ptr<InboxRing> ring(new InboxRing());
  ring->name_ = bare;
  ring->base_ = static_cast<unsigned char*>(base);
  ring->size_ = static_cast<size_t>(st.st_size);
  uint32_t magic;
  std::memcpy(&magic, ring->base_, 4);
  std::memcpy(&ring->capacity_, ring->base_ + 8, 8);
  if (magic != kRingMagic || ring->capacity_ == 0 ||
      ring->capacity_ > ring->size_ - kRingDataAt) {
    return nullptr;  // NOTE: the destructor unmaps it
  }
  return ring;
}

InboxRing::~InboxRing() {
  if (base_ != nullptr) munmap(base_, size_);
}

bool InboxRing::has_records() const {
  return __atomic_load_n(word(kRingTailAt), __ATOMIC_ACQUIRE) !=
         __atomic_load_n(word(kRingHeadAt), __ATOMIC_RELAXED);
}

}  // namespace triton_mp
