"""The frontend's ring to the scheduler with its pushes made in C++ under a lock
(``ring_producer.h``), so that the gRPC thread can push into it too without racing the
Python thread on the ring's tail.

Imported by ``frontend.main`` (``Sender(..., attach=shared_ring_attach())`` for the ring to
the scheduler). ``SharedRing`` is a ``Ring`` (``ipc.memory.ring``: the layout, and every
consumer-side and read-only method, unchanged) whose ``push`` goes through
``_native.RingProducer``: the same bytes (``tests/unit/test_ring_producer.py``), the same
exceptions. ``close`` lets go of the producer's export of the mapping first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from triton_mp.ipc.memory.ring import RecordTooLarge, Ring, RingFull
from triton_mp.ipc.memory.shm import Segment

_PUSHED, _FULL, _TOO_LARGE = 0, 1, 2
"""``RingProducer.push``'s answers."""


class Producer(Protocol):
    """``_native.RingProducer``: a ring's producer end shared by threads."""

    capacity: int

    def push(self, data: bytes | memoryview, /) -> int: ...

    def push_all(self, records: list[bytes], timeout_s: float, /) -> int: ...

    def quiet_word(self) -> int: ...

    def release(self) -> None: ...


class SharedRing(Ring):
    """A ``Ring`` whose producer end is shared with C++ (see the module docstring).

    Args:
        segment: the ring's segment (attached).
        producer_type: ``_native.RingProducer``.
    """

    __slots__ = ("producer",)

    def __init__(self, segment: Segment, producer_type: Callable[[Segment], Producer]) -> None:
        super().__init__(segment)
        try:
            self.producer = producer_type(segment)
        except BaseException:
            super().close()
            raise
        """The C++ producer (its pushes hold the lock the gRPC thread's hold)."""

    def push(self, payload: bytes | memoryview) -> None:
        """``Ring.push``, in C++ under the producer's lock.

        Raises:
            RingFull: not enough free space now.
            RecordTooLarge: the record can never fit (more than half the capacity).
        """
        result = self.producer.push(payload)
        if result == _PUSHED:
            return
        if result == _FULL:
            raise RingFull
        cap = self.capacity
        raise RecordTooLarge(f"record of {len(payload)} bytes does not fit a ring of {cap} bytes")

    def close(self) -> None:
        """Stop the producer (its export of the mapping ends), then unmap as ``Ring.close``."""
        self.producer.release()
        super().close()


def attach_shared(producer_type: Callable[[Segment], Producer]) -> Callable[[str], Ring]:
    """``Ring.attach`` for a ``SharedRing`` over ``producer_type``."""

    def attach(name: str) -> Ring:
        return SharedRing(Segment.attach(name), producer_type)

    return attach
