"""The frontend's inbox read by a C++ thread (``answer_thread.h``): what it hands to Python.

Imported by ``frontend.native.known_answers``. While the answer thread runs it is the inbox
rings' only consumer: it waits on the inbox's wake-up (the FIFO and its arm,
``ipc.memory.notify``) in place of the event loop, reads every record, serves the answers of
the known calls the gRPC thread keeps (``known_answer.h``: an owned call's plain answer, the
set the loop's inbox pass served before) and hands them to gRPC from its own thread, without
the GIL. Every other record, byte for byte and in ring order, is queued for Python:

- answers C++ does not serve (an error, a trace, a decoupled or stream response, a form
  with no head taught, a call Python took over, any answer of a call C++ does not keep),
  ``RequestFailed``, ``StatsReply``, ``QueueReply``;
- the scheduler's and the other frontends' news (``ShmRegistered``, ``ModelAvailability``,
  trace and log settings, readiness).

``AnswerQueue`` is what the loop watches then, in the inbox's place (``PollingSelector.watch``,
``InboxHandler.read_through``): an eventfd the thread writes only when the loop armed it
before blocking (as a worker's FIFO byte only when armed), ``has_pending`` between events,
and ``drain``, which decodes the queued records with the inbox's decoder, so Python applies
them exactly as it applied the rings' records. The thread also wakes Python for an early wake
of a worker while Python awaits answers of its own (its early poll, ``polling_loop``), and
when a settle is due (the request ids C++ takes run low, ``known_teach.IDS_LOW``); every drain
settles (``NativeAnswers.settle_counts``: the served calls' tensor bytes, exact before the
next ``StatsReply`` is applied, and the ids refilled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Native(Protocol):
    """The extension's ``answer_thread_*`` functions (``answer_thread_py.cc``)."""

    def answer_thread_start(
        self, wakeup: str, rings: tuple[str, ...], ids_low: int, serve: bool = True, /
    ) -> bool: ...
    def answer_thread_stop(self) -> None: ...
    def answer_thread_add_ring(self, name: str, /) -> bool: ...
    def answer_thread_remove_ring(self, name: str, /) -> bool: ...
    def answer_thread_wake(self) -> None: ...
    def answer_thread_fd(self) -> int: ...
    def answer_thread_take(self) -> tuple[list[bytes], bool]: ...
    def answer_thread_pending(self) -> bool: ...
    def answer_thread_arm(self, awaiting: bool, /) -> None: ...
    def answer_thread_disarm(self) -> bool: ...
    def answer_thread_clear(self) -> None: ...
    def answer_thread_stats(self) -> dict[str, int] | None: ...


class QueueWaiter:
    """The loop's wake-up while the thread reads the inbox (``notify.Waiter``'s FIFO
    interface: ``fileno``, ``arm`` before blocking, ``disarm``, ``clear``).

    Args:
        native: the extension module.
        awaiting: the answers Python awaits (``len(PendingTable)``): an early wake of a
            worker is passed on only then.
    """

    def __init__(self, native: Native, awaiting: Callable[[], int]) -> None:
        self._native = native
        self._awaiting = awaiting
        self._fd = native.answer_thread_fd()

    def fileno(self) -> int:
        """The eventfd, readable when the thread queued something after ``arm``."""
        return self._fd

    def arm(self) -> None:
        """Ask for a write on the next record (the caller rechecks ``has_pending``)."""
        self._native.answer_thread_arm(self._awaiting() > 0)

    def disarm(self) -> bool:
        """Stop asking; False when the thread wrote first (``clear`` reads it)."""
        return self._native.answer_thread_disarm()

    def clear(self) -> None:
        """Read the eventfd's count (before draining)."""
        self._native.answer_thread_clear()


class AnswerQueue:
    """What the answer thread hands to Python (module docstring); the thread runs from
    ``start`` until ``stop``.

    Args:
        native: the extension module.
        decode: the inbox's decoder of one record (``Inbox.decode_buffer``).
        awaiting: the answers Python awaits (``len(PendingTable)``).
    """

    def __init__(
        self, native: Native, decode: Callable[[Any], Any], awaiting: Callable[[], int]
    ) -> None:
        self._native = native
        self._decode = decode
        self.waiter = QueueWaiter(native, awaiting)

    @classmethod
    def start(
        cls,
        native: Native,
        wakeup: str,
        rings: tuple[str, ...],
        ids_low: int,
        decode: Callable[[Any], Any],
        awaiting: Callable[[], int],
    ) -> AnswerQueue | None:
        """Start the thread on the inbox's wake-up ``wakeup`` (a FIFO wake-up's name) and
        ``rings``; None: one runs already.

        Raises:
            OSError: the wake-up or a ring could not be opened.
        """
        if not native.answer_thread_start(wakeup, rings, ids_low):
            return None
        return cls(native, decode, awaiting)

    def stop(self) -> None:
        """End the thread (joined); records it did not read stay in the rings, and what it
        queued stays here for the last ``drain``."""
        self._native.answer_thread_stop()

    def has_pending(self) -> bool:
        """Whether a drain would give something (records, or a settle due)."""
        return self._native.answer_thread_pending()

    def drain(self) -> list[Any]:
        """The queued records, decoded, oldest first (a settle due gives no record)."""
        records, _settle = self._native.answer_thread_take()
        decode = self._decode
        return [decode(r) for r in records]

    def add_ring(self, name: str) -> None:
        """Read one more ring (a model instance started at run time)."""
        self._native.answer_thread_add_ring(name)

    def remove_ring(self, name: str) -> None:
        """A ring whose producer is gone: what it holds is read now (served, or queued for
        the next ``drain``), then it is let go."""
        self._native.answer_thread_remove_ring(name)

    def wake(self) -> None:
        """Make the thread read the rings now (a ring added may hold records already)."""
        self._native.answer_thread_wake()

    def stats(self) -> dict[str, int] | None:
        """The thread's counters (``answer_thread.h`` AnswerThreadStats; None: stopped)."""
        return self._native.answer_thread_stats()
