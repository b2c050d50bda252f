"""The gRPC thread's wake rule (``frontend/native/known_wake.h``) against its Python twin
(``frontend.dispatch.wakes``): the same drawn cases through ``HeldWakes`` / ``Allowance`` and
through ``_native.known_wake_replay`` must give the same answers; and the allowance the
Python thread counts in on the native frontend is the C++ one (``KnownWake``)."""

from __future__ import annotations

import struct
import time
from contextlib import nullcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.frontend import native
from triton_mp.frontend.dispatch.wakes import Allowance, HeldWakes, SharedAllowance
from triton_mp.ipc.recordio.quiet_requests import allowance_word

pytestmark = pytest.mark.skipif(not native.available(), reason=native.UNAVAILABLE)

Push = tuple[int, int, int]
"""(bucket bit, rows, arrival ns) of one pushed request (bit 0: a record that always wakes)."""
Words = tuple[int, int, int, int, int]
"""(quiet word, forming mask, epoch, allowed rows, floor ns) read at a batch's end."""
Batch = tuple[list[Push], Words, bool]
"""A held batch's pushes, the words, and whether Python sends a batch of one outside
``held`` (the per-send path, ``HeldWakes._joins``)."""

STAMPS = st.sampled_from([1, 5, 10, 20])
"""Arrival stamps and floors (ns): few, so that ``first < floor`` is drawn both ways."""
PUSH = st.tuples(st.sampled_from([0, 0b1, 0b10, 0b100]), st.integers(1, 4), STAMPS)
WORDS = st.tuples(
    st.integers(0, 0b111), st.integers(0, 0b111), st.integers(0, 5), st.integers(0, 9), STAMPS
)
BATCHES = st.lists(st.tuples(st.lists(PUSH, max_size=4), WORDS, st.booleans()), max_size=12)
"""Epochs drawn from 0-5 in any order: new, repeated and older ones (the stale rule)."""


def _native():  # type: ignore[no-untyped-def]
    import importlib

    return importlib.import_module("triton_mp.frontend.native._native")


def fresh_epoch() -> int:
    """An epoch newer (u32 serial order) than any an earlier test of this run showed the
    process's one allowance (``KnownWake``), which refuses older ones: microseconds since
    boot, mod 2**32. Mod 2**32, not 2**31: the allowance compares epochs in u32 serial order,
    where 2**32 - 1 -> 0 is one step on, but 2**31 - 1 -> 0 is a step back; with 2**31 every
    35.8 minutes of uptime a test's epoch read older than the one before it and was refused
    (a land.sh run failed so at 08:32 on 2026-12-07, the wrap's minute)."""
    return (time.monotonic_ns() // 1000) & 0xFFFFFFFF


def record(rows: int, arrival_ns: int) -> bytes:
    """A payload with a REQUEST's arrival_ns (u64 at 16) and batch_size (u32 at 52)."""
    data = bytearray(80)
    struct.pack_into("<Q", data, 16, arrival_ns)
    struct.pack_into("<I", data, 52, rows)
    return bytes(data)


def python_wakes(batches: list[Batch]) -> list[bool]:
    """Whether each batch woke the scheduler, by ``HeldWakes``."""
    now: list[Words] = []
    wakes: list[int] = []

    def forming() -> tuple[int, int, int]:
        _, mask, epoch, rows, floor = now[-1]
        return mask, allowance_word(epoch, rows), floor

    held = HeldWakes(
        lambda _d: True,
        lambda _d: wakes.append(1),  # NOTE: send_bytes pushes and wakes (a record that must)
        lambda: wakes.append(1),
        lambda: now[-1][0],
        forming,
    )
    woke = []
    for pushes, words, single in batches:
        now.append(words)
        before = len(wakes)
        with nullcontext() if single and len(pushes) == 1 else held.held():
            for bit, rows, at in pushes:
                held.send(record(rows, at), bit)
        assert len(wakes) - before <= 1
        woke.append(len(wakes) > before)
    return woke


def native_wakes(batches: list[Batch]) -> list[bool]:
    """Whether each batch woke the scheduler, by ``known_wake.h``'s rule."""
    steps: list[tuple[int, ...]] = []
    for pushes, (quiet, mask, epoch, rows, floor), _ in batches:
        steps.extend((0, bit, n, at) for bit, n, at in pushes)
        steps.append((1, quiet, mask, allowance_word(epoch, rows), floor))
    got = _native().known_wake_replay(steps)
    assert isinstance(got, list)
    return got


@settings(max_examples=400, deadline=None)
@given(BATCHES)
def test_the_native_rule_wakes_exactly_when_held_wakes_does(batches: list[Batch]) -> None:
    assert native_wakes(batches) == python_wakes(batches)


JOIN = st.tuples(
    st.sampled_from([0, 0b1, 0b11, 0b100]),
    st.integers(0, 5),
    STAMPS,
    st.integers(0, 0b111),
    st.integers(0, 4),
    st.integers(0, 9),
    STAMPS,
)
"""(bits, rows, first ns, mask, epoch, allowed rows, floor ns) of one ``Allowance.join``."""


@settings(max_examples=400, deadline=None)
@given(st.lists(JOIN, max_size=16))
def test_the_native_allowance_joins_exactly_when_allowance_does(
    joins: list[tuple[int, int, int, int, int, int, int]],
) -> None:
    allowance = Allowance()
    want = [
        allowance.join(bits, rows, first, (mask, allowance_word(epoch, n), floor))
        for bits, rows, first, mask, epoch, n, floor in joins
    ]
    steps = [
        (2, bits, rows, first, mask, allowance_word(epoch, n), floor)
        for bits, rows, first, mask, epoch, n, floor in joins
    ]
    assert _native().known_wake_replay(steps) == want


def test_an_older_epoch_is_refused_and_a_newer_one_counts_from_zero() -> None:
    a = Allowance()
    words = (0b1, allowance_word(7, 4), 0)
    assert not a.join(0b1, 1, 5, words)  # NOTE: the first epoch seen counts as spent
    assert a.join(0b1, 4, 5, (0b1, allowance_word(8, 4), 0))
    assert not a.join(0b1, 1, 5, (0b1, allowance_word(8, 4), 0))  # NOTE: 4 of 4 used
    assert not a.join(0b1, 1, 5, (0b1, allowance_word(7, 9), 0))  # NOTE: older: refused
    assert a.epoch == 8
    assert a.used == 4
    assert a.join(0b1, 1, 5, (0b1, allowance_word(0, 4), 0)) is False  # NOTE: 0 < 8
    wrapped = Allowance()
    wrapped.join(0b1, 1, 5, (0b1, allowance_word(0xFFFFFFFF, 0), 0))
    assert wrapped.join(0b1, 2, 5, (0b1, allowance_word(0, 3), 0))  # NOTE: 0 follows 2**32-1


def test_the_python_thread_counts_in_the_gRPC_threads_allowance() -> None:
    n = _native()
    shared = SharedAllowance(n.known_wake_join)
    base = fresh_epoch()
    shared.join(0b1, 1, 5, (0b1, allowance_word(base, 0), 0))
    assert shared.join(0b1, 2, 5, (0b1, allowance_word(base + 1, 3), 0))
    assert n.known_wake_join(0b1, 1, 5, 0b1, allowance_word(base + 1, 3), 0)
    assert not shared.join(0b1, 1, 5, (0b1, allowance_word(base + 1, 3), 0))  # NOTE: 3 of 3
    assert not n.known_wake_join(0b1, 1, 5, 0b1, allowance_word(base, 9), 0)  # NOTE: older
