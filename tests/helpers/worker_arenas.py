"""A worker's output arenas as a test reads them from /dev/shm (not a test module)."""

from __future__ import annotations

import struct
from pathlib import Path

_HEADER = struct.Struct("<IIQ")
"""tensor_pool's block header: u32 state, u32 generation, u64 size."""


def live_output_blocks(server_pid: int, worker_pid: int) -> int:
    """LIVE block headers (state 1, generation != 0, a size of whole 64-byte steps within the
    arena) at the 64-byte steps of every output arena of the worker ``worker_pid`` of server
    ``server_pid`` (``triton_mp_<server>_w*p<worker>_a*``). Payload bytes could look like a
    header: callers keep their payloads floats that never do."""
    live = 0
    for path in Path("/dev/shm").glob(f"triton_mp_{server_pid}_w*p{worker_pid}_a*"):
        data = path.read_bytes()
        for off in range(64, len(data) - 16, 64):
            state, generation, size = _HEADER.unpack_from(data, off)
            live += state == 1 and generation != 0 and size % 64 == 0 and 0 < size <= len(data)
    return live


def live_output_holders(server_pid: int, worker_pid: int) -> list[int]:
    """The holder word (``ipc.output_holds``: u32 at +16, the pid of the frontend process
    whose reply holds the block in place; 0: none) of each LIVE block
    ``live_output_blocks`` counts, in arena order."""
    holders = []
    for path in sorted(Path("/dev/shm").glob(f"triton_mp_{server_pid}_w*p{worker_pid}_a*")):
        data = path.read_bytes()
        for off in range(64, len(data) - 24, 64):
            state, generation, size = _HEADER.unpack_from(data, off)
            if state == 1 and generation != 0 and size % 64 == 0 and 0 < size <= len(data):
                holders.append(int.from_bytes(data[off + 16 : off + 20], "little"))
    return holders
