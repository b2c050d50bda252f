"""Channels: a ring plus the consumer's wake-up semaphore plus a typed codec.

Imported by the role ``main`` modules. Each consumer process has ONE semaphore that all of
its producers post (``Inbox``), and one SPSC ring per producer; a consumer woken once drains
every ring, so under load one wake-up (one syscall) serves many messages.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import posix_ipc

from triton_mp.errors import ErrorCode, TritonMPError
from triton_mp.ipc.codec import Decoder, encode
from triton_mp.ipc.ring import Ring, RingFull

T = TypeVar("T")


class ChannelTimeout(TritonMPError):
    """A ring stayed full past the send deadline: its consumer is stuck or dead."""

    code = ErrorCode.UNAVAILABLE


class Sender:
    """Producer end: push an encoded message into one ring and wake the consumer.

    Args:
        ring_name: the POSIX name of a ring created by the supervisor.
        semaphore_name: the consumer's wake-up semaphore.
        full_timeout_s: how long ``send`` waits for room in a full ring.
    """

    def __init__(self, ring_name: str, semaphore_name: str, full_timeout_s: float = 10.0) -> None:
        self._ring = Ring.attach(ring_name)
        self._sem = posix_ipc.Semaphore(semaphore_name)
        self._full_timeout_s = full_timeout_s

    def send(self, msg: Any) -> None:
        """Encode and push ``msg``, then post the consumer's semaphore.

        Raises:
            ChannelTimeout: the ring stayed full for ``full_timeout_s``.
        """
        self.send_bytes(encode(msg))

    def send_bytes(self, data: bytes) -> None:
        """Push already-encoded bytes (see ``send``)."""
        try:
            self._ring.push(data)
        except RingFull:
            deadline = time.monotonic() + self._full_timeout_s
            pause_s = 20e-6
            while True:
                # NOTE: the consumer drains every ring when woken; a post makes sure it is.
                self._sem.release()
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 5e-3)
                try:
                    self._ring.push(data)
                    break
                except RingFull:
                    if time.monotonic() > deadline:
                        raise ChannelTimeout(
                            f"ring {self._ring.segment.name} full for {self._full_timeout_s}s"
                        ) from None
        self._sem.release()

    def close(self) -> None:
        """Unmap the ring and close the semaphore handle."""
        self._ring.close()
        self._sem.close()


class Inbox(Generic[T]):
    """Consumer end: one semaphore, several rings, one decoder for the direction's union."""

    def __init__(self, semaphore_name: str, ring_names: Sequence[str], msg_type: Any) -> None:
        self._sem = posix_ipc.Semaphore(semaphore_name)
        self._rings = [Ring.attach(n) for n in ring_names]
        self._decoder: Decoder[T] = Decoder(msg_type)

    def wait(self, timeout_s: float | None) -> bool:
        """Block until woken or ``timeout_s`` passes (None = forever). True when woken."""
        try:
            self._sem.acquire(timeout_s)
        except posix_ipc.BusyError:
            return False
        return True

    def wake(self) -> None:
        """Wake the consumer from any thread (used to stop a blocked reader)."""
        self._sem.release()

    def drain(self) -> list[T]:
        """Every message pending in every ring, decoded (per-ring order kept)."""
        out: list[T] = []
        dec = self._decoder.decode
        for ring in self._rings:
            for rec in ring.pop_all():
                out.append(dec(rec))
        return out

    def close(self) -> None:
        """Unmap the rings and close the semaphore handle."""
        for ring in self._rings:
            ring.close()
        self._sem.close()
