"""A worker's ``channel.Sender`` pushing through C (``push_record``, ``ipc/native/ring_push.h``,
given by ``workers.answering.PUSH_RECORD``) against one pushing through ``Ring.push``.

On two rings of one capacity, the same random sends (``send_bytes``, ``send_lazy``,
``push_bytes``; sizes from empty to too large for the ring) give the same outcome (sent,
``RecordTooLarge``, ``ChannelTimeout`` while the ring is full) and the consumer pops the same
records in the same order.

No processes: rings and semaphores of this test process, unlinked at the end.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from tests.helpers.ring_channel import ring_channel
from triton_mp.ipc import Sender
from triton_mp.ipc.channel import ChannelTimeout
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.memory.ring import RecordTooLarge, Ring
from triton_mp.workers.answering import PUSH_RECORD

pytestmark = pytest.mark.skipif(PUSH_RECORD is None, reason="_answer_writer is not built")

CAPACITY = 1 << 12


@pytest.fixture
def two() -> Iterator[tuple[tuple[str, Wakeup], tuple[str, Wakeup]]]:
    with ring_channel("snp_py", CAPACITY) as py, ring_channel("snp_c", CAPACITY) as c:
        yield py, c


def _send(sender: Sender, how: int, data: bytes) -> str:
    try:
        if how == 0:
            sender.send_bytes(data)
        elif how == 1:
            sender.send_lazy(data)
        else:
            sender.push_bytes(data)
    except RecordTooLarge:
        return "too large"
    except ChannelTimeout:
        return "full"
    return "sent"


def test_the_c_push_sends_what_ring_push_sends(
    two: tuple[tuple[str, Wakeup], tuple[str, Wakeup]],
) -> None:
    (py_ring, py_wake), (c_ring, c_wake) = two
    by_python = Sender(py_ring, py_wake, full_timeout_s=0.001)
    by_c = Sender(c_ring, c_wake, full_timeout_s=0.001, push_record=PUSH_RECORD)
    readers = [Ring.attach(py_ring), Ring.attach(c_ring)]
    rng = random.Random(19)
    outcomes: set[str] = set()
    try:
        for step in range(3000):
            size = rng.choice((0, 1, 7, 8, 24, 46, 300, 1500, CAPACITY // 2 - 4, CAPACITY))
            data = bytes([step % 251]) * size
            how = rng.randrange(3)
            got = _send(by_python, how, data)
            assert _send(by_c, how, data) == got
            outcomes.add(got)
            if rng.random() < 0.3:
                popped = [r.pop_all() for r in readers]
                assert popped[0] == popped[1]
        assert outcomes == {"sent", "too large", "full"}
    finally:
        by_python.close()
        by_c.close()
        for r in readers:
            r.close()
