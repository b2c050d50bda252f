"""A formed batch's wire form: its two tuples (``batch_forms``, for ``SchedulerCore._assign``)
and the ``BatchAssign`` written straight into its worker's ring (``push_assign``, for
``scheduler.main.Router.send``), each in one C call.

Imported by ``scheduler.core`` and ``scheduler.main``. ``batch_forms(items)`` returns a
batch's payloads (``Queued.payload``) and their wire forms (``records.wire_form``: a record's
bytes, any other request itself), as two tuples. ``push_assign(ring, assign)`` writes what
``Ring.push(encode(assign))`` writes, byte for byte (msgspec's msgpack of the array-like,
tagged struct), when the ring is a plain ``Ring`` (a subclass pushes its own way) and the
batch is plain: every request a frontend's record bytes
(``records.wire_form``), no sequence ``slots`` and no ``released`` correlation IDs. It
returns False and writes nothing for any other batch, a full ring or a record too large
for the ring: the caller then sends it as before (``Sender.push_bytes(encode(assign))``,
which waits on a full ring and raises ``RecordTooLarge`` in its own words). Both in C when the
extension is built (``scheduler/native/assign_push.cc``, in
``triton_mp.scheduler._queue_records``), else ``batch_forms_py`` and ``push_assign_py``,
their Python twins (tests/unit/test_assign_push.py compares C and twin over random batches
and ring states).

Why: per batch of ~10 add_sub requests, the encode (a 4 KiB bytes object) and ``Ring.push``
cost ~1.3 µs hot, the two tuples ~1.9 µs, and many times that live at c=16 (the dispatch
phase, issue 34).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from triton_mp.ipc.memory.ring import RecordTooLarge, Ring, RingFull
from triton_mp.ipc.protocol.messages import BatchAssign
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.recordio.records import Request, RequestRecord, wire_form
from triton_mp.scheduler.policies.policy import Queued

Forms = tuple[tuple[Request, ...], tuple[Any, ...]]
"""A batch's requests and their wire forms (``BatchAssign.requests``)."""


def batch_forms_py(items: Sequence[Queued]) -> Forms:
    """``items``' payloads and their wire forms (``records.wire_form``), as two tuples.

    The Python twin of ``batch_forms`` in ``scheduler/native/assign_push.cc``."""
    reqs: tuple[Request, ...] = tuple([q.payload for q in items])  # type: ignore[misc]
    return reqs, tuple(map(wire_form, reqs))


def plain_assign(assign: BatchAssign) -> bool:
    """Whether ``push_assign`` writes ``assign``: every request record bytes, no slots,
    no released correlation IDs."""
    return (
        not assign.slots and not assign.released and all(type(r) is bytes for r in assign.requests)
    )


def push_assign_py(ring: Ring, assign: Any) -> bool:
    """``assign`` (a ``BatchAssign``) pushed into ``ring`` as ``Ring.push(encode(assign))``
    when it is plain (``plain_assign``) and fits now; False with nothing written otherwise.

    The Python twin of ``push_assign`` in ``scheduler/native/assign_push.cc``."""
    if type(ring) is not Ring or type(assign) is not BatchAssign or not plain_assign(assign):
        return False
    try:
        ring.push(encode(assign))
    except (RingFull, RecordTooLarge):
        return False
    return True


try:
    # NOTE: mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.scheduler import _queue_records as native  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): the Python twin writes
    native = None  # type: ignore[assignment,unused-ignore]


def _configure() -> tuple[Callable[[Sequence[Queued]], Forms], Callable[[Ring, Any], bool]]:
    """The C functions bound to the classes they read and write, or the Python twins when
    the extension is not built (or is older than this module)."""
    if native is None or not hasattr(native, "push_assign"):
        return batch_forms_py, push_assign_py
    assert BatchAssign.__struct_fields__ == (
        "batch_id", "requests", "dispatch_ns", "rows", "slots", "released",
    )  # fmt: skip
    assert BatchAssign.__struct_config__.array_like
    tag = BatchAssign.__struct_config__.tag
    assert isinstance(tag, str)
    native.configure_assign(BatchAssign, tag, Queued, RequestRecord)
    write = native.push_assign
    forms = native.batch_forms

    def batch_forms_c(items: Sequence[Queued]) -> Forms:
        # NOTE: None: an item the C reader does not take (not exactly a Queued, a tuple).
        got = forms(items) if type(items) is tuple else None
        return batch_forms_py(items) if got is None else got

    def push_assign_c(ring: Ring, assign: Any) -> bool:
        # NOTE: a Ring subclass pushes its own way (a SharedRing's producer is shared).
        return type(ring) is Ring and bool(write(ring.segment.buf, assign))

    return batch_forms_c, push_assign_c


batch_forms, push_assign = _configure()
"""``batch_forms_py``'s and ``push_assign_py``'s semantics, in C when the extension is built."""
