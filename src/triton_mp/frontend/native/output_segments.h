// Workers' output arenas as the frontend's native answer side sees them: each segment mapped
// read-only on first use (shm_open + mmap PROT_READ, by the BlockRef's POSIX name), kept
// until Drop, and a block freed through the descriptor (pwrite of FREE into its state word:
// one 4-byte write, only while the header still holds LIVE and the block's generation).
// A mapping is shared (SegmentMapping): a reply that sends output bytes in place
// (held_block.h) keeps the segment mapped and its descriptor open until gRPC lets go of
// them, after a Drop too.
// Python twins: ipc/tensor_pool.py (SegmentCache: read-only attachments; free_block: the
// rule and the header `u32 state, u32 generation, u64 block_bytes`), ipc/output_holds.py
// (the output block's `u32 holder, u32 flags` at +16), ipc/memory/shm.py
// (Segment.store_u32 through the descriptor). OutputSegments is used by the Python thread
// only (the inbox pass); not thread-safe. A SegmentMapping is immutable once made: any
// thread may read through it and free with it.
#ifndef TRITON_MP_FRONTEND_NATIVE_OUTPUT_SEGMENTS_H_
#define TRITON_MP_FRONTEND_NATIVE_OUTPUT_SEGMENTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

namespace triton_mp {

// One segment mapped read-only, with the descriptor its frees write through; unmapped and
// closed with its last holder.
class SegmentMapping {
  struct Opened {};  // NOTE: only Open makes one

 public:
  SegmentMapping(Opened, int fd, const unsigned char* base, uint64_t bytes)
      : fd_(fd), base_(base), bytes_(bytes) {}
  // Maps shm object `name`; nullptr: it cannot be opened or mapped.
  static std::shared_ptr<const SegmentMapping> Open(const std::string& name);
  ~SegmentMapping();
  SegmentMapping(const SegmentMapping&) = delete;
  SegmentMapping& operator=(const SegmentMapping&) = delete;

  // The bytes [offset, offset + n), or nullptr when the range is not inside the segment.
  const unsigned char* View(uint64_t offset, uint64_t n) const;
  // The payload size of the block whose header is at `offset` (its u64 block_bytes less the
  // header), or 0 when no header fits there.
  uint64_t BlockPayload(uint64_t offset) const;
  // Marks the block whose header is at `offset` FREE (tensor_pool.free_block's rule). False:
  // nothing written (past the end, not LIVE, another generation; generation 0: any).
  bool Free(uint64_t offset, uint64_t generation) const;
  // Records `holder` (this process's pid) as the holder of the block at `offset`: a pwrite
  // of its u32 holder word (+16), only while the header holds LIVE and `generation`; the
  // worker frees the blocks a dead process held (ipc/output_holds.py: hold_block,
  // OutputArenas.free_held_by). False: nothing written.
  bool Hold(uint64_t offset, uint64_t generation, uint32_t holder) const;
  // Whether the block at `offset` may be held in place: its owner did not flag it COPY
  // (u32 flags at +20: its arenas were past their fill mark, ipc/output_holds.py).
  bool MayHold(uint64_t offset) const;

 private:
  int fd_;
  const unsigned char* base_;
  uint64_t bytes_;
};

class OutputSegments {
 public:
  OutputSegments() = default;
  OutputSegments(const OutputSegments&) = delete;
  OutputSegments& operator=(const OutputSegments&) = delete;

  // Segment `name`, mapped now if new; nullptr: it cannot be opened.
  const std::shared_ptr<const SegmentMapping>& Get(std::string_view name);
  // The bytes [offset, offset + n) of segment `name` (mapped now if new); nullptr: the
  // segment cannot be opened, or the range is not inside it.
  const unsigned char* View(std::string_view name, uint64_t offset, uint64_t n);
  // Frees the block of segment `name` whose header is at `offset` (SegmentMapping::Free).
  bool Free(std::string_view name, uint64_t offset, uint64_t generation);
  // Lets every segment go (the supervisor dropped a worker's arenas: a later answer maps
  // what it names again; a reply still sending from one keeps it until it is sent).
  void Drop() { segments_.clear(); }
  size_t mapped() const { return segments_.size(); }

 private:
  std::unordered_map<std::string, std::shared_ptr<const SegmentMapping>> segments_;
  std::string name_;  // the name being looked up (reused)
  std::shared_ptr<const SegmentMapping> none_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_OUTPUT_SEGMENTS_H_
