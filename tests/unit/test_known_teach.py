"""``frontend.native.known_teach.NativeKnown``, without a server: a fake extension records
what is taught and cleared. A call sent on the patched lane is taught once per key and id,
only when it qualifies (its block in the newest arena, not decoupled, no ordering, nothing
traced or forwarded), a call naming client regions with its windows, holds and the
registrations' generation; every un-teaching event the wiring hooks (a model table update,
a trace settings update, the drain, a known key dropped, a new arena, a region registered
or unregistered) clears what C++ was taught; request ids are handed in bulk when few are
left."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triton_mp.frontend.native.known_teach import IDS_BULK, IDS_LOW, NativeKnown, Wiring
from triton_mp.ipc import TensorRef


class FakeNative:
    def __init__(self) -> None:
        self.taught: list[tuple[Any, ...]] = []
        self.cleared = 0
        self.arenas: list[Any] = []
        self.ids: list[tuple[int, int]] = []
        self.left = 0
        self.ring: Any = None
        self.detached = False
        self.answers_forgotten = 0
        self.regions_changed = 0
        self.generation = 40
        self.uses: dict[int, int] = {}
        self.released: list[tuple[int, ...]] = []
        self.routes: list[tuple[Any, ...]] = []
        self.input_arenas: list[tuple[str, int]] = []

    def known_set_arena(self, arena: Any) -> None:
        self.arenas.append(arena)
        self.cleared += 1
        self.taught.clear()  # NOTE: as KnownSubmit::SetArena

    def known_set_ring(self, producer: Any, wake: str | None) -> None:
        self.ring = (producer, wake)

    def known_add_ids(self, first: int, n: int) -> None:
        self.ids.append((first, n))
        self.left += n

    def known_ids_left(self) -> int:
        return self.left

    def known_teach(self, *args: Any) -> bool:
        self.taught.append(args)
        return True

    def known_teach_route(self, *args: Any) -> bool:
        self.routes.append(args)
        return True

    def direct_stats(self) -> dict[str, int]:
        return {"handed": 3, "not_offered": 1, "lost": 0, "routes": 2}

    def known_clear(self) -> None:
        self.cleared += 1
        self.taught.clear()

    def known_detach(self) -> None:
        self.detached = True

    def known_stats(self) -> dict[str, int]:
        return {"sent": 0}

    def known_answer_forget(self) -> None:
        self.answers_forgotten += 1

    def known_answer_input_arena(self, name: str, hold_limit: int) -> None:
        self.input_arenas.append((name, hold_limit))

    def known_answer_stats(self) -> dict[str, int]:
        return {"answered": 0}

    def known_regions_changed(self) -> None:
        self.regions_changed += 1
        self.generation += 1
        self.known_clear()

    def known_regions_generation(self) -> int:
        return self.generation

    def known_regions_uses(self, region_id: int) -> int:
        return self.uses.get(region_id, 0)

    def known_regions_release(self, held: tuple[int, ...]) -> None:
        self.released.append(held)


@dataclass
class Segment:
    name: str
    size_bytes: int = 1 << 20


@dataclass
class Arena:
    segment: Segment


@dataclass
class Allocator:
    newest: Arena | None = None
    on_new_arena: Any = None


@dataclass
class Pending:
    next_id: int = 50

    def reserve(self, n: int) -> int:
        first = self.next_id
        self.next_id += n
        return first


@dataclass
class Calls:
    pending: Pending = field(default_factory=Pending)
    lessons: list[Any] = field(default_factory=list)
    on_registered: Any = None
    release_held: Any = None

    def learn(self, lesson: Any) -> int:
        self.lessons.append(lesson)
        return len(self.lessons)


@dataclass
class Model:
    name: str = "m"
    decoupled: bool = False
    preserve_ordering: bool = False


@dataclass
class Valid:
    version: int = 2
    batch_size: int = 1


@dataclass
class Known:
    model: Model = field(default_factory=Model)
    valid: Valid = field(default_factory=Valid)
    inputs: tuple[Any, ...] = (("A", "FP32", (1, 3), 12), ("B", "FP32", (1, 30), 120))
    sizes: tuple[int, ...] = (12, 120)
    block_bytes: int = 64 + 128
    held: tuple[int, ...] = ()
    templates: dict[tuple[str, str], tuple[bytes, int]] = field(default_factory=dict)


class Gate:
    allowed = True

    def known_allowed(self) -> bool:
        return self.allowed


@dataclass
class Hooks:
    on_refresh: Any = None
    on_table_change: Any = None
    shm: Any = None


class Inference:
    def __init__(self) -> None:
        self.sent: Any = None
        self.unteach: Any = None

    def teach_with(self, sent: Any, unteach: Any) -> None:
        self.sent, self.unteach = sent, unteach


pulls: list[int] = []


def wired() -> tuple[NativeKnown, FakeNative, Allocator, Hooks, Inference, Gate, Calls]:
    native, calls, gate = FakeNative(), Calls(), Gate()

    def pull() -> bool:
        pulls.append(native.cleared)  # NOTE: how many clears came before the pull
        return False

    teacher = NativeKnown(native, calls, gate, pull)  # type: ignore[arg-type]
    allocator = Allocator(Arena(Segment("/a0")))
    hooks = Hooks()
    inference = Inference()
    wiring = Wiring("producer", "/wake", allocator, hooks, hooks, Registry())  # type: ignore[arg-type]
    teacher.wire(wiring, inference)  # type: ignore[arg-type]
    hooks.shm = wiring.shm
    return teacher, native, allocator, hooks, inference, gate, calls


class Registry:
    """``SystemShmRegistry``'s ``watch`` attribute."""

    watch: Any = None


def known(client_id: str = "r", segment: str = "/a0") -> Known:
    k = Known()
    k.templates[(segment, client_id)] = (b"T" * 200, 4)
    return k


def test_a_qualifying_call_is_taught_once_with_its_positions_and_lesson() -> None:
    teacher, native, allocator, _, inference, _, calls = wired()
    assert native.ring == ("producer", "/wake")
    assert native.arenas == [allocator.newest]
    newest = allocator.newest.segment
    assert native.input_arenas == [(newest.name, newest.size_bytes // 2)]  # NOTE: InputBlock
    inference.sent(b"key", known(), "r", "/a0")
    inference.sent(b"key", known(), "r", "/a0")
    assert native.taught == [(b"key", b"r", 1, (12, 120), (0, 64), 64 + 192, b"T" * 200, 4)]
    assert native.routes == [(b"key", b"r", "m", 2)]  # NOTE: its version's direct routes
    lesson = calls.lessons[0]
    assert (lesson.model, lesson.version, lesson.client_id, lesson.segment) == ("m", 2, "r", "/a0")
    assert lesson.copied == 132
    assert native.ids == [(50, IDS_BULK)]  # NOTE: ids handed with the first offer
    stats = {"sent": 0, "answered": 0, "direct_handed": 3, "direct_not_offered": 1}
    assert teacher.stats() == {**stats, "direct_lost": 0}  # NOTE: the metrics' outcomes


def test_what_does_not_qualify_is_never_taught() -> None:
    teacher, native, _, _, inference, gate, _ = wired()
    inference.sent(b"key", known(segment="/old"), "r", "/old")  # not the newest arena
    inference.sent(b"key", known(), "x", "/a0")  # no template for this id
    inference.sent(("not", "bytes"), known(), "r", "/a0")
    for change in ("decoupled", "preserve_ordering"):
        k = known()
        setattr(k.model, change, True)
        inference.sent(b"key", k, "r", "/a0")
    gate.allowed = False
    inference.sent(b"key", known(), "r", "/a0")
    assert native.taught == []
    gate.allowed = True
    inference.sent(b"key", known(), "r", "/a0")
    assert len(native.taught) == 1


def test_a_call_naming_client_regions_is_taught_with_its_windows_and_holds() -> None:
    """An input in a client's region is named by its window's offset (``None``: a raw
    entry, copied), the call's held region ids and the generation C++ has now go with the
    lesson, and the lesson keeps the holds for the registration of the calls C++ sends."""
    teacher, native, _, _, inference, _, calls = wired()
    k = known()
    window = TensorRef("W", "FP32", (1, 4), "/client", 4096, 16, 7)
    k.inputs = (("A", "FP32", (1, 3), 12), window, ("B", "FP32", (1, 30), 120))
    k.held = (7, 9)
    inference.sent(b"key", k, "r", "/a0")
    lesson = (b"key", b"r", 1, (12, 120), (0, 64), 64 + 192, b"T" * 200, 4)
    assert native.taught == [(*lesson, (None, 4096, None), (7, 9), 40)]
    assert calls.lessons[0].held == (7, 9)
    assert calls.release_held == native.known_regions_release


def test_the_registry_watch_unteaches_before_a_change_and_counts_cs_uses() -> None:
    """``SystemShmRegistry.watch``: ``changing`` moves C++'s generation and forgets every
    lesson (then registers what C++ sent: its holds become Python's); ``uses`` is C++'s
    count for the region."""
    teacher, native, _, hooks, inference, _, _ = wired()
    assert hooks.shm.watch is teacher
    inference.sent(b"key", known(), "r", "/a0")
    pulls.clear()
    before = native.cleared
    hooks.shm.watch.changing()
    assert native.regions_changed == 1
    assert native.taught == []
    assert pulls
    assert pulls[0] > before
    native.uses[7] = 2
    assert hooks.shm.watch.uses(7) == 2
    assert hooks.shm.watch.uses(8) == 0


def test_each_event_unteaches_and_the_next_call_is_taught_again() -> None:
    teacher, native, allocator, hooks, inference, _, _ = wired()
    events = [
        hooks.on_table_change,  # model table update (models, versions, direct routes)
        hooks.on_refresh,  # trace settings update
        inference.unteach,  # the drain, a known key dropped or the table cleared
    ]
    for event in events:
        inference.sent(b"key", known(), "r", "/a0")
        assert len(native.taught) == 1
        before = native.cleared
        pulls.clear()
        event()
        assert native.cleared == before + 1
        assert native.taught == []
        # NOTE: what C++ sent before is registered after the clear (the drain counts it)
        assert pulls == [before + 1]
    # NOTE: a new newest arena: C++ allocates there and forgets; a form of the old one is
    # not taught any more, one of the new one is
    inference.sent(b"key", known(), "r", "/a0")
    new = Arena(Segment("/a1"))
    allocator.on_new_arena(new)
    assert native.arenas[-1] is new
    assert native.taught == []
    inference.sent(b"key", known(), "r", "/a0")
    assert native.taught == []
    inference.sent(b"key", known(segment="/a1"), "r", "/a1")
    assert len(native.taught) == 1


def test_ids_are_handed_in_bulk_when_few_are_left_and_nothing_after_close() -> None:
    teacher, native, _, _, inference, _, _ = wired()
    inference.sent(b"key", known(), "r", "/a0")
    native.left = IDS_LOW - 1
    inference.sent(b"other", known(), "r", "/a0")
    assert native.ids == [(50, IDS_BULK), (50 + IDS_BULK, IDS_BULK)]
    teacher.close()
    assert native.detached
    native.taught.clear()
    inference.sent(b"third", known(), "r", "/a0")
    assert native.taught == []


def test_ids_are_refilled_after_a_pass_registered_calls_c_sent() -> None:
    """Not only the Python path's ``offer`` refills: a pass that registered calls C++ sent
    (``KnownCalls.on_registered``) does too, so a run of native calls does not run dry."""
    teacher, native, _, _, _, _, calls = wired()
    assert calls.on_registered == teacher.refill
    native.left = IDS_LOW
    calls.on_registered()
    assert native.ids == []
    native.left = IDS_LOW - 1
    calls.on_registered()
    assert native.ids == [(50, IDS_BULK)]
    calls.on_registered()
    assert native.ids == [(50, IDS_BULK)]
    teacher.close()
    native.left = 0
    calls.on_registered()
    assert native.ids == [(50, IDS_BULK)]
