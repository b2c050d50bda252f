// An output block of a worker's arena whose bytes a native reply sends in place: the reply's
// slices reference the block's bytes (no copy) and hold the block; the block is freed
// (SegmentMapping::Free, tensor_pool.free_block's rule) when the last of them lets go, on
// whatever thread gRPC drops it, but only once armed: the answer was committed to its calls
// (known_answer_py.cc Serve, after Handoff::AnswerOwned). A hold never armed (the answer went
// to Python, which reads and frees the block itself) frees nothing. Armed, the block's header
// names this process (its pid: ipc/output_holds.py, the worker frees a dead holder's blocks).
// An input block (`input_bytes` not 0: a block of this process's own input arena, of that
// many bytes, whose bytes the worker named as a call's output, workers/native/
// answer_writer.cc PlanAlias) is held the same way in place of the call's FreeInput: freed
// (the same rule) when gRPC has sent it, with no holder recorded (the arena is this
// process's: it goes with it). The bytes of input blocks armed and not yet freed are counted
// (input_bytes_held): a reply holds one only below a mark (known_answer.h InputBlock), so
// clients that do not read their answers cannot hold the whole input arena (the output
// blocks' twin: their COPY flag, ipc/output_holds.py).
// Python twin of the rule:
// dispatch/pending.py (the block freed after its answer was sent; an input block named by
// an output, after the response is released), known_calls.py (the Python path, which copies
// instead).
#ifndef TRITON_MP_FRONTEND_NATIVE_HELD_BLOCK_H_
#define TRITON_MP_FRONTEND_NATIVE_HELD_BLOCK_H_

#include <grpcpp/support/slice.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "output_segments.h"

namespace triton_mp {

class HeldBlock {
 public:
  HeldBlock(std::shared_ptr<const SegmentMapping> mapping, uint64_t offset, uint64_t generation,
            uint64_t input_bytes = 0)
      : mapping_(std::move(mapping)),
        offset_(offset),
        generation_(generation),
        input_bytes_(input_bytes) {}
  ~HeldBlock();
  HeldBlock(const HeldBlock&) = delete;
  HeldBlock& operator=(const HeldBlock&) = delete;

  // The block is freed with its last holder from now on; an output block's header names
  // this process as its holder (SegmentMapping::Hold), so the worker frees it if this
  // process dies first.
  void Arm();
  uint64_t offset() const { return offset_; }
  bool input() const { return input_bytes_ != 0; }
  const SegmentMapping& mapping() const { return *mapping_; }

  // A slice of the `n` bytes at `data` (inside the block) that holds `hold` until gRPC lets
  // go of it.
  static grpc::Slice SliceOf(const std::shared_ptr<HeldBlock>& hold, const unsigned char* data,
                             size_t n);

  // Frees done and refused (another state or generation: tensor_pool's stray frees) by
  // armed holds so far, process-wide.
  static uint64_t freed();
  static uint64_t refused();
  // The bytes of the input blocks armed and not yet freed, process-wide (class comment).
  static uint64_t input_bytes_held();

 private:
  std::shared_ptr<const SegmentMapping> mapping_;
  uint64_t offset_;
  uint64_t generation_;
  uint64_t input_bytes_;  // not 0: a block of this process's input arena (class comment)
  std::atomic<bool> armed_{false};
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_HELD_BLOCK_H_
