// See held_block.h.
#include "held_block.h"

#include <grpc/slice.h>
#include <unistd.h>

namespace triton_mp {

namespace {

std::atomic<uint64_t> g_freed{0};
std::atomic<uint64_t> g_refused{0};
std::atomic<uint64_t> g_input_held{0};

// grpc_slice_new_with_user_data's destroy callback: drops the slice's hold.
void Release(void* user_data) {
  std::unique_ptr<std::shared_ptr<HeldBlock>> hold(
      static_cast<std::shared_ptr<HeldBlock>*>(user_data));
}

}  // namespace

void HeldBlock::Arm() {
  // NOTE: before armed_: the free (the last holder's, after Arm returns) comes after it
  if (input_bytes_ == 0) {
    mapping_->Hold(offset_, generation_, static_cast<uint32_t>(getpid()));
  } else {
    g_input_held.fetch_add(input_bytes_, std::memory_order_relaxed);
  }
  armed_.store(true, std::memory_order_release);
}

HeldBlock::~HeldBlock() {
  if (!armed_.load(std::memory_order_acquire)) return;
  if (input_bytes_ != 0) g_input_held.fetch_sub(input_bytes_, std::memory_order_relaxed);
  if (mapping_->Free(offset_, generation_)) {
    g_freed.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_refused.fetch_add(1, std::memory_order_relaxed);
  }
}

grpc::Slice HeldBlock::SliceOf(const std::shared_ptr<HeldBlock>& hold, const unsigned char* data,
                               size_t n) {
  // NOTE: the C API takes the hold as a void*: owned by the slice until its destroy callback
  auto owned = std::make_unique<std::shared_ptr<HeldBlock>>(hold);
  grpc_slice slice = grpc_slice_new_with_user_data(
      const_cast<unsigned char*>(data), n, Release, owned.get());  // NOTE: gRPC never writes
  owned.release();
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
}

uint64_t HeldBlock::freed() { return g_freed.load(std::memory_order_relaxed); }
uint64_t HeldBlock::refused() { return g_refused.load(std::memory_order_relaxed); }
uint64_t HeldBlock::input_bytes_held() { return g_input_held.load(std::memory_order_relaxed); }

}  // namespace triton_mp
