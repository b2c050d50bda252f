// The layout of one ipc ring, shared by its C++ producer (ring_producer.h) and consumer
// (inbox_ring.h); the words every ring has, and the push itself, are ipc/native/ring_push.h's. Python twin: src/triton_mp/ipc/memory/ring.py, whose module docstring is the
// layout (little-endian): 0 u32 magic RING_MAGIC, 4 u32 version, 8 u64 capacity (data bytes);
// 64 u64 tail (producer), 128 u64 head (consumer), 136 u64 quiet word, 144 u64 x3 forming
// words (known_wake.h); 192 the data area of u32-length records padded to 8 bytes, WRAP as a
// length meaning "continue at the start".
#ifndef TRITON_MP_FRONTEND_NATIVE_RING_LAYOUT_H_
#define TRITON_MP_FRONTEND_NATIVE_RING_LAYOUT_H_

#include <cstdint>

#include "../../ipc/native/ring_push.h"  // kRingMagic, kRingTailAt, kRingHeadAt, kRingDataAt, kRingWrap

namespace triton_mp {

inline constexpr uint64_t kRingQuietAt = 136;
inline constexpr uint64_t kRingFormingAt = 144;  // mask, allowance word, floor ns (known_wake.h)

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_RING_LAYOUT_H_
