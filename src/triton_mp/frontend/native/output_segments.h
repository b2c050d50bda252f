// Workers' output arenas as the frontend's native answer side sees them: each segment mapped
// read-only on first use (shm_open + mmap PROT_READ, by the BlockRef's POSIX name), kept
// until Drop, and a block freed through the descriptor (pwrite of FREE into its state word:
// one 4-byte write, only while the header still holds LIVE and the block's generation).
// Python twins: ipc/tensor_pool.py (SegmentCache: read-only attachments; free_block: the
// rule and the header `u32 state, u32 generation, u64 block_bytes`), ipc/memory/shm.py
// (Segment.store_u32 through the descriptor). Used by the Python thread only (the inbox
// pass); not thread-safe.
#ifndef TRITON_MP_FRONTEND_NATIVE_OUTPUT_SEGMENTS_H_
#define TRITON_MP_FRONTEND_NATIVE_OUTPUT_SEGMENTS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace triton_mp {

class OutputSegments {
 public:
  OutputSegments() = default;
  ~OutputSegments();
  OutputSegments(const OutputSegments&) = delete;
  OutputSegments& operator=(const OutputSegments&) = delete;

  // The bytes [offset, offset + n) of segment `name` (mapped now if new); nullptr: the
  // segment cannot be opened, or the range is not inside it.
  const unsigned char* View(std::string_view name, uint64_t offset, uint64_t n);
  // Marks the block whose header is at `offset` FREE (tensor_pool.free_block's rule). False:
  // nothing written (not mapped, past the end, not LIVE, another generation).
  bool Free(std::string_view name, uint64_t offset, uint64_t generation);
  // Unmaps every segment (the supervisor dropped a worker's arenas: a later answer maps
  // what it names again).
  void Drop();
  size_t mapped() const { return segments_.size(); }

 private:
  struct Mapped {
    int fd = -1;
    const unsigned char* base = nullptr;
    uint64_t bytes = 0;
  };
  Mapped* Get(std::string_view name);

  std::unordered_map<std::string, Mapped> segments_;
  std::string name_;  // the name being looked up (reused)
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_OUTPUT_SEGMENTS_H_
