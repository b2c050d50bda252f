// ArenaBlocks (input_arena.h): the circular allocator of tensor_pool._Arena, in C++.
#include "input_arena.h"

#include <cstring>

namespace triton_mp {

namespace {

uint32_t LoadState(const unsigned char* base, uint64_t offset) {
  // NOTE: another process stores FREE here (one aligned 4-byte store): read it once.
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(base + offset), __ATOMIC_ACQUIRE);
}

}  // namespace

void ArenaBlocks::Reclaim(const unsigned char* base) {
  while (!live_.empty() && LoadState(base, live_.front().first) == kBlockFree) {
    live_.pop_front();
  }
}

int64_t ArenaBlocks::TryAlloc(unsigned char* base, uint64_t block_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Reclaim(base);
  const uint64_t start_of_blocks = kArenaHeaderBytes;
  const uint64_t end = start_of_blocks + capacity_;
  uint64_t start;
  if (live_.empty()) {
    if (block_bytes > capacity_) return -1;
    start = start_of_blocks;
  } else {
    const uint64_t first = live_.front().first;
    const uint64_t head = live_.back().first + live_.back().second;
    if (live_.back().first >= first) {  // not wrapped: [head, end) and [start, first) free
      if (block_bytes <= end - head) {
        start = head;
      } else if (block_bytes <= first - start_of_blocks) {
        start = start_of_blocks;
      } else {
        return -1;
      }
    } else {  // wrapped: [head, first) free
      if (block_bytes > first - head) return -1;
      start = head;
    }
  }
  generation_ = generation_ == UINT32_MAX ? 1 : generation_ + 1;  // 1 .. 2**32 - 1, never 0
  // NOTE: generation and size first, then LIVE in one store: a reader checking the header
  // (tensor_pool.free_block) never sees LIVE beside the room's previous generation.
  std::memcpy(base + start + 4, &generation_, sizeof generation_);
  std::memcpy(base + start + 8, &block_bytes, sizeof block_bytes);
  __atomic_store_n(reinterpret_cast<uint32_t*>(base + start), kBlockLive, __ATOMIC_RELEASE);
  live_.emplace_back(start, block_bytes);
  return static_cast<int64_t>(start);
}

size_t ArenaBlocks::LiveBlocks(const unsigned char* base) {
  std::lock_guard<std::mutex> lock(mu_);
  Reclaim(base);
  return live_.size();
}

size_t ArenaBlocks::UnfreedBlocks(const unsigned char* base) {
  std::lock_guard<std::mutex> lock(mu_);
  Reclaim(base);
  size_t n = 0;
  for (const auto& block : live_) n += LoadState(base, block.first) != kBlockFree;
  return n;
}

}  // namespace triton_mp
