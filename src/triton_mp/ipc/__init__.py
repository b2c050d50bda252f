"""Inter-process plumbing: shared-memory rings, tensor arenas, typed messages.

The names other roles import. ``ipc`` imports nothing from the role packages.
"""

from triton_mp.ipc import messages
from triton_mp.ipc.channel import ChannelTimeout, Inbox, Sender
from triton_mp.ipc.codec import Decoder, encode
from triton_mp.ipc.messages import BlockRef, ErrorInfo, TensorRef
from triton_mp.ipc.ring import Ring, RingFull
from triton_mp.ipc.shm import Segment, object_name, sweep_stale
from triton_mp.ipc.tensor_pool import ArenaAllocator, ArenaExhausted, SegmentCache, free_block

__all__ = [
    "ArenaAllocator",
    "ArenaExhausted",
    "BlockRef",
    "ChannelTimeout",
    "Decoder",
    "ErrorInfo",
    "Inbox",
    "Ring",
    "RingFull",
    "Segment",
    "SegmentCache",
    "Sender",
    "TensorRef",
    "encode",
    "free_block",
    "messages",
    "object_name",
    "sweep_stale",
]
