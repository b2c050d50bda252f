// One input arena's block allocator, owner side: which blocks of the arena are live, oldest
// first, and the generation of the newest. Plain C++ (no Python), so the gRPC thread can
// allocate with it later as the Python thread does now (cpp-known-path design note).
//
// Python twin: _Arena in src/triton_mp/ipc/tensor_pool.py (try_alloc, _reclaim, live_blocks,
// unfreed_blocks), the same decisions step for step; tests/unit/test_input_arena.py runs both
// on the same operations and compares every offset, header and count. Shared-memory layout
// (tensor_pool's module docstring): a 64-byte arena header, then blocks; a block is
// u32 state (LIVE 1 / FREE 0), u32 generation (1 .. 2**32 - 1), u64 block_bytes (header
// included), payload at +64. The owner writes generation and size, then LIVE with one aligned
// 4-byte store; the block's last reader (another process) writes FREE the same way.
//
// Thread-safe: every public call holds the allocator's mutex, so the Python thread and the gRPC
// thread can both allocate from one arena (the object is shared_ptr-owned by both).
#ifndef TRITON_MP_FRONTEND_NATIVE_INPUT_ARENA_H_
#define TRITON_MP_FRONTEND_NATIVE_INPUT_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

namespace triton_mp {

inline constexpr uint64_t kArenaHeaderBytes = 64;
inline constexpr uint32_t kBlockLive = 1;
inline constexpr uint32_t kBlockFree = 0;

class ArenaBlocks {
 public:
  // capacity: the arena's bytes after its 64-byte header (the segment is 64 + capacity).
  explicit ArenaBlocks(uint64_t capacity) : capacity_(capacity) {}

  // A new LIVE block of block_bytes (header included, a multiple of 64) in the arena mapped
  // at base: its offset from the segment's start, or -1 when it does not fit now.
  int64_t TryAlloc(unsigned char* base, uint64_t block_bytes);
  // Blocks from the oldest unfreed one to the newest (freed ones behind it included).
  size_t LiveBlocks(const unsigned char* base);
  // Blocks whose reader has not written FREE yet.
  size_t UnfreedBlocks(const unsigned char* base);

  uint64_t capacity() const { return capacity_; }
  uint32_t generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }
  void set_generation(uint32_t generation) {
    std::lock_guard<std::mutex> lock(mu_);
    generation_ = generation;
  }

 private:
  // Drop the freed blocks at the front (oldest first; one unfreed block stops it). Under mu_.
  void Reclaim(const unsigned char* base);

  mutable std::mutex mu_;
  const uint64_t capacity_;
  std::deque<std::pair<uint64_t, uint64_t>> live_;  // (offset, block_bytes), oldest first
  uint32_t generation_ = 0;                          // the newest block's; 0: none yet
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_INPUT_ARENA_H_
