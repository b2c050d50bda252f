"""The forming allowance the native frontend's two producers share (``known_wake.h``).

Imported by ``frontend.main``. On the native frontend the gRPC thread pushes known calls into
the ring to the scheduler and holds their wake per completion-queue batch in C++
(``KnownWake``), while the Python thread pushes the rest through ``HeldWakes``. The
scheduler's forming allowance (``scheduler.forming``) is for the ring, so both count in one
place: ``SharedAllowance.join`` is ``wakes.Allowance.join`` counted in the C++ allowance,
under its lock (``_native.known_wake_join``).
"""

from __future__ import annotations

import importlib
from typing import Protocol

from triton_mp.frontend import native


class _Joins(Protocol):
    def __call__(
        self, bits: int, rows: int, first_ns: int, mask: int, allowance: int, floor_ns: int, /
    ) -> bool: ...


class SharedAllowance:
    """``wakes.Allowance`` counted in the process's C++ allowance (``KnownWake::Join``).

    Args:
        join: ``_native.known_wake_join``.
    """

    __slots__ = ("_join",)

    def __init__(self, join: _Joins) -> None:
        self._join = join

    def join(self, bits: int, rows: int, first_ns: int, words: tuple[int, int, int]) -> bool:
        """``Allowance.join``: whether requests of buckets ``bits``, ``rows`` rows in all,
        the earliest stamped ``first_ns`` (CLOCK_MONOTONIC ns), may go without a wake-up
        under the forming words ``words`` (mask, allowance word, floor ns); counts them."""
        mask, allowance, floor = words
        return self._join(bits, rows, first_ns, mask, allowance, floor)


def shared_allowance() -> SharedAllowance | None:
    """The allowance shared with the gRPC thread; None where the extension is absent (the
    Python frontend's ``HeldWakes`` keeps its own)."""
    if not native.available():
        return None
    module = importlib.import_module("triton_mp.frontend.native._native")
    return SharedAllowance(module.known_wake_join)
