"""Teaching the native server's gRPC thread the known unary calls it submits itself
(``known_submit.h``), and un-teaching it.

Imported by ``frontend.native.public_port``. A known call Python sent on the patched lane
(``Inference.submit_known_to``: a known key, byte sizes that match, a record template for
its form, no histogram; the handoff's gate: no tracing, no forwarded headers) is offered
here (``offer``); its key, byte sizes, input positions in the block, record template and
version (``known_teach_route``: the direct handoff's routes, ``direct_handoff.h``) are taught
to C++ (``_native.known_teach``) with a ``Lesson`` (``KnownCalls.learn``: what registers
the calls C++ sends by it). The next call with that key, whatever its request id (written
into its record by C++, ``record_patch.h`` WithClientId), is then submitted by the
gRPC thread without Python: its arena block, its bytes, its record, and its handoff to an
idle instance of its version when the scheduler offers one (``dispatch.direct``'s rules),
else its push and its wake; Python only registers it (``KnownCalls.register``) and answers
it as before. Anything that does not match a lesson goes to Python as it always did, so
every Triton rule and word stays here.

A call naming windows in clients' system shared-memory regions (``known.held``) is taught
with them (``known_regions.h``): each input entry's window offset (named, never copied:
``write_known``), the region ids it holds and the registrations' generation. The key names
each window (region name, offset, byte size: ``grpc.wire``), so every call of the lesson
names the windows Python checked; C++ refuses the lesson once the registrations changed
(``changing``, which the registry calls before every registration change:
``SystemShmRegistry.watch``), and counts the uses of each call it sent until its answer or
its hand-over to Python (``uses``, added to Python's ``in_use``: an unregistration while
one is in flight is refused in Python's words).

Every lesson is forgotten (``forget``, C++ ``Clear``; the response heads of the answer side
too, ``known_answers``, whose owned calls ``pull`` then hands to Python) on each event after
which Python's decision could differ: a model table update (models, versions, direct
routes), the drain, a trace settings change, a known key dropped or the known table
cleared, a client region registered or unregistered (here or by a peer); a new newest input
arena re-points C++ at it (``arena_changed``, which forgets too: a template names its
arena). Never taught: a form whose block is not in the newest arena, a decoupled model (the
known lane of ModelInfer never has one), and whatever the patched lane already refuses
(``preserve_ordering``, latency histograms, a response-cache miss).

Request ids are handed to C++ in bulk (``PendingTable.reserve``) when few are left: after
each pass that registered calls C++ sent (``KnownCalls.on_registered``), and on each
``offer``; a call that finds none left goes the Python way.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.dispatch.known_requests import KnownRequest
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.native.known_calls import KnownCalls, Lesson
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.ipc import ArenaAllocator, TensorRef
from triton_mp.ipc.output_holds import COPY_MARK
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, ArenaBlocks, align

IDS_LOW = 256
"""Fewer request ids left in C++ than this: ``offer`` hands it ``IDS_BULK`` more."""
IDS_BULK = 4096


class Native(Protocol):
    """The extension's ``known_*`` functions (``known_submit_py.cc``)."""

    def known_set_arena(self, arena: object, /) -> None: ...
    def known_set_ring(self, producer: object, wake: str | None, /) -> None: ...
    def known_add_ids(self, first: int, n: int, /) -> None: ...
    def known_ids_left(self) -> int: ...
    def known_teach(
        self,
        key: bytes,
        client_id: bytes,
        lesson_id: int,
        sizes: tuple[int, ...],
        at: tuple[int, ...],
        block_bytes: int,
        record: bytes,
        bit: int,
        entries: tuple[int | None, ...] | None = None,
        held: tuple[int, ...] | None = None,
        generation: int = 0,
        /,
    ) -> bool: ...
    def known_teach_route(
        self, key: bytes, client_id: bytes, model: str, version: int, /
    ) -> bool: ...
    def known_clear(self) -> None: ...
    def known_regions_changed(self) -> None: ...
    def known_regions_generation(self) -> int: ...
    def known_regions_uses(self, region_id: int, /) -> int: ...
    def known_regions_release(self, held: tuple[int, ...], /) -> None: ...
    def known_detach(self) -> None: ...
    def known_stats(self) -> dict[str, int]: ...
    def known_answer_forget(self) -> None: ...
    def known_answer_input_arena(self, name: str, hold_limit: int, /) -> None: ...
    def known_answer_stats(self) -> dict[str, int]: ...
    def direct_stats(self) -> dict[str, int]: ...


class Gate(Protocol):
    """``InferenceServicer.known_allowed``: no tracing, no forwarded headers."""

    def known_allowed(self) -> bool: ...


class Refreshes(Protocol):
    """``Tracer``: ``on_refresh`` is called after every trace settings update."""

    on_refresh: Callable[[], None] | None


class TableChanges(Protocol):
    """``InboxHandler``: ``on_table_change`` is called before a model table update."""

    on_table_change: Callable[[], None] | None


@dataclass(frozen=True, slots=True)
class Wiring:
    """What the gRPC thread submits with, and the events that un-teach it.

    Attributes:
        producer: the ``_native.RingProducer`` of the ring to the scheduler
            (``shared_ring.SharedRing.producer``); ``wake``: the scheduler's wake-up
            semaphore's name.
        arena: the frontend's input arenas (C++ allocates in the newest).
        tracer, inbox: their trace settings and model table updates un-teach.
        shm: the client regions (every registration change un-teaches; ``watch``).
        lost: the error a known call whose direct handoff was lost fails with (the ring to
            the scheduler's ``Sender.full_error``; ``handoff.Handoff.lost``).
    """

    producer: object
    wake: str
    arena: ArenaAllocator
    tracer: Refreshes
    inbox: TableChanges
    shm: SystemShmRegistry | None = None
    lost: Callable[[], TritonMPError] | None = None


class NativeKnown:
    """The gRPC thread's lessons (module docstring).

    Args:
        native: the extension module.
        calls: the handoff's known calls (lessons for registration).
        gate: whether a known call may skip the handler now.
        pull: registers the calls C++ submitted and queued so far (``Handoff.pull_known``);
            ``forget`` calls it after un-teaching, so the drain counts every call C++ sent.
    """

    def __init__(
        self, native: Native, calls: KnownCalls, gate: Gate, pull: Callable[[], bool] | None = None
    ) -> None:
        self._native = native
        self._pull = pull
        self._calls = calls
        self._pending: PendingTable = calls.pending
        self._gate = gate
        self._segment = ""
        """The arena C++ allocates in (``arena_changed``); "": none, nothing is taught."""
        self._taught: set[Hashable] = set()
        """The keys taught: a lesson serves calls with any request id (C++ writes each
        call's id into its record and its response)."""
        self._closed = False
        calls.on_registered = self.refill
        calls.release_held = native.known_regions_release

    def wire(self, wiring: Wiring, inference: Inference) -> None:
        """Give C++ the ring to the scheduler, its wake-up and the newest input arena, and
        hook the teaching and every un-teaching event (module docstring)."""
        self._native.known_set_ring(wiring.producer, wiring.wake)
        newest = wiring.arena.newest
        if newest is not None:
            self.arena_changed(newest)
        wiring.arena.on_new_arena = self.arena_changed
        inference.teach_with(self.offer, self.forget)
        wiring.tracer.on_refresh = self.forget
        wiring.inbox.on_table_change = self.forget
        if wiring.shm is not None:
            wiring.shm.watch = self

    def changing(self) -> None:
        """A client region is about to be registered or unregistered
        (``SystemShmRegistry.watch``): C++ refuses every lesson taught before (once this
        returns, it sends none by them), and every lesson is forgotten."""
        self._native.known_regions_changed()
        self.forget()

    def uses(self, region_id: int) -> int:
        """Calls C++ sent naming ``region_id`` that Python has not taken over
        (``SystemShmRegistry.in_use`` adds them)."""
        return self._native.known_regions_uses(region_id)

    def arena_changed(self, arena: ArenaBlocks) -> None:
        """A new newest input arena (``ArenaAllocator.on_new_arena``; a
        ``_native.InputArena``): C++ allocates in it from now on, and forgets every
        lesson."""
        if self._closed:
            return
        self._native.known_set_arena(arena)
        self._segment = arena.segment.name
        # NOTE: an output a worker answered from a call's input block is sent from there
        # (known_answer.h InputBlock) while unread replies hold under the output arenas'
        # copy mark of this arena; no call of the new arena is sent before a lesson is
        limit = int(arena.segment.size_bytes * COPY_MARK)
        self._native.known_answer_input_arena(self._segment, limit)
        self._taught.clear()

    def forget(self) -> None:
        """Un-teach every lesson (module docstring: the events), then register what C++ sent
        before (``pull``: the drain's ``wait_drained`` counts the pending table)."""
        self._native.known_clear()
        self._native.known_answer_forget()  # NOTE: the heads taught, the workers' arenas
        self._taught.clear()
        if self._pull is not None:
            self._pull()

    def close(self) -> None:
        """Nothing is submitted natively any more; the arena's mapping is let go (before
        the arena is closed)."""
        self._closed = True
        self._native.known_detach()
        self._segment = ""
        self._taught.clear()

    def stats(self) -> dict[str, int]:
        """C++'s counters (``known_submit.h`` KnownStats: sent, declined, cleared, ...;
        ``known_answer_py.cc``: answered, released, ...; ``direct_handoff.h`` DirectStats:
        direct_handed, the sent calls handed to an idle instance, direct_not_offered and
        direct_lost, those of a version with routes that went to the scheduler; while the
        answer thread runs, answer_thread.h: thread_served, the inbox records it served,
        thread_to_python, those it queued for Python, thread_lent, those of them the gRPC
        thread served itself while it waited for a call it had just handed, answer_borrow.h)."""
        stats = self._native.known_stats()
        stats.update(self._native.known_answer_stats())
        direct = self._native.direct_stats()  # NOTE: direct_handoff.h DirectStats
        for outcome in ("handed", "not_offered", "lost"):
            stats[f"direct_{outcome}"] = direct[outcome]
        thread = getattr(self._native, "answer_thread_stats", None)
        read = None if thread is None else thread()  # NOTE: answer_thread.h AnswerThreadStats
        if read is not None:
            stats["thread_served"] = read["served"]
            stats["thread_to_python"] = read["to_python"]
            stats["thread_lent"] = read["lent_served"]
        return stats

    def refill(self) -> None:
        """Hand C++ ``IDS_BULK`` more request ids when fewer than ``IDS_LOW`` are left
        (nothing once closed)."""
        native = self._native
        if not self._closed and native.known_ids_left() < IDS_LOW:
            native.known_add_ids(self._pending.reserve(IDS_BULK), IDS_BULK)

    def offer(self, key: Hashable, known: KnownRequest, client_id: str, segment: str) -> None:
        """Python sent a known call on the patched lane (``Inference.submit_known_to``):
        teach its key (for any request id) if it qualifies (module docstring)."""
        native = self._native
        if self._closed:
            return
        self.refill()
        if segment != self._segment or key in self._taught or not isinstance(key, bytes):
            return
        model = known.model
        template = known.templates.get((segment, client_id))
        if template is None or model.decoupled or model.preserve_ordering:
            return
        if not self._gate.known_allowed():
            return
        at: list[int] = []
        entries: list[int | None] = []
        pos = 0
        for spec in known.inputs:
            if isinstance(spec, TensorRef):
                entries.append(spec.offset)  # NOTE: a window in a client's region
                continue
            entries.append(None)
            at.append(pos)
            pos += align(spec[3])
        held = known.held
        lesson = Lesson(
            model.name,
            known.valid.version,
            client_id,
            segment,
            sum(known.sizes),
            held,
            known.valid.batch_size,
        )
        lesson_id = self._calls.learn(lesson)
        block_bytes = BLOCK_HEADER_BYTES + align(max(known.block_bytes, 1))
        record, bit = template
        cid = client_id.encode()
        args = (key, cid, lesson_id, known.sizes, tuple(at), block_bytes)
        if held:
            taught = native.known_teach(
                *args, record, bit, tuple(entries), held, native.known_regions_generation()
            )
        else:
            taught = native.known_teach(*args, record, bit)
        if taught:
            native.known_teach_route(key, cid, model.name, known.valid.version)
            self._taught.add(key)  # NOTE: C++ serves it with any request id
