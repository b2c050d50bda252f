"""Inter-process plumbing: shared-memory rings, tensor arenas, typed messages.

The names other roles import. ``ipc`` imports nothing from the role packages.
"""

from triton_mp.ipc.channel import ChannelTimeout, Inbox, Sender
from triton_mp.ipc.memory.ring import Ring, RingFull
from triton_mp.ipc.memory.shm import Segment, sweep_stale
from triton_mp.ipc.memory.topology import Topology
from triton_mp.ipc.protocol import messages
from triton_mp.ipc.protocol.messages import BlockRef, ErrorInfo, TensorRef
from triton_mp.ipc.recordio.codec import Decoder, encode
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
    "Topology",
    "encode",
    "free_block",
    "messages",
    "sweep_stale",
]
