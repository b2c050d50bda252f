"""A request for a model whose instances are all busy reaches the scheduler without a wake-up.

The decision (``scheduler.request_wakeups``: which model buckets the scheduler sets in the
frontends' rings' quiet word, and that their instances' ``BatchDone`` then always wakes it),
the frontend's side (``ipc.recordio.quiet_requests.request_bit``, ``HeldWakes`` with a
quiet word) and the protocol on the real ring and semaphore in every interleaving of the two
sides' steps (Dekker's, as for the quiet ``BatchDone``: ``test_quiet_done``).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator

import msgspec
import pytest

from tests.helpers.ring_channel import ring_channel
from tests.unit.scheduler_harness import DYNAMIC, Harness, model_spec
from triton_mp.frontend.dispatch.wakes import HeldWakes
from triton_mp.ipc import Sender
from triton_mp.ipc.memory.notify import Waiter, Wakeup, fence
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.protocol.messages import CancelRequest
from triton_mp.ipc.protocol.specs import BatchingSpec, QueuePolicySpec, SequenceSpec
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.recordio.quiet_requests import model_bit, model_bucket, request_bit
from triton_mp.ipc.recordio.records import encode_request
from triton_mp.scheduler.request_wakeups import queue_limits, quiet_for_requests

OTHER = model_spec("other_model", (5,))
assert model_bucket("add_sub") != model_bucket("other_model")
ADD_SUB = model_bit("add_sub")


def _record(h: Harness, model: str = "add_sub", timeout_us: int = 0) -> bytes:
    """A REQUEST record as a frontend writes it (the harness's request, not handled)."""
    req = h.request(model=model, timeout_us=timeout_us)
    data = encode_request(req)
    assert data is not None
    return data


# ------------------------------------------------------------------ the record's bit
def test_a_request_records_bit_is_its_models_bucket_and_other_records_have_none() -> None:
    h = Harness(models=(DYNAMIC, OTHER))
    assert model_bucket("add_sub") == zlib.crc32(b"add_sub") % 64  # the same in every process
    assert request_bit(_record(h)) == ADD_SUB
    assert request_bit(_record(h, "other_model")) == model_bit("other_model")
    assert request_bit(_record(h, timeout_us=500)) == 0  # its own queue timeout: always wake
    cancel = CancelRequest(reply_to=h.request().reply_to, request_id=1, model="add_sub", version=1)
    assert request_bit(encode(cancel)) == 0  # msgpack: always wake
    assert request_bit(b"") == 0


# ------------------------------------------------------------------ the scheduler's side
def _busy_both(h: Harness) -> list[tuple[int, object]]:
    """Dispatch a preferred batch of 4 to each add_sub instance."""
    batches = []
    for _ in range(2):
        for _ in range(4):
            h.request()
        batches += h.dispatch()
    assert sorted(i for i, _ in batches) == [0, 1]
    return batches  # type: ignore[return-value]


def test_a_model_is_quiet_only_while_every_instance_runs_a_batch() -> None:
    h = Harness(models=(DYNAMIC, OTHER))
    h.ready(0, 1, 5)
    assert h.core.quiet_requests() == 0  # idle instances take a request at once
    for _ in range(4):
        h.request()
    ((iid, batch),) = h.dispatch()
    assert h.core.quiet_requests() == 0  # the other instance is idle
    for _ in range(4):
        h.request()
    ((iid2, batch2),) = h.dispatch()
    mask = h.core.quiet_requests()
    assert mask == ADD_SUB  # other_model's instance is idle: its bucket stays clear
    # NOTE: the queue is empty, yet their BatchDone must wake: it is what reads the requests.
    assert {0, 1} <= h.core.quiet_done()
    assert not {0, 1} & h.core.quiet_done(mask)
    h.request()  # queued behind the busy instances
    assert h.core.quiet_requests() == ADD_SUB
    h.done(iid, batch)
    assert h.core.quiet_requests() == 0  # the freed instance takes the queued request next
    h.dispatch()
    assert h.core.quiet_requests() == 0  # it waits out the batching delay, idle
    h.clock.advance_us(200)
    assert len(h.dispatch()) == 1
    assert h.core.quiet_requests() == ADD_SUB


def test_nothing_is_quiet_while_the_server_stops_defers_or_rate_limits() -> None:
    h = Harness(models=(DYNAMIC,))
    h.ready(0, 1)
    _busy_both(h)
    assert h.core.quiet_requests() == ADD_SUB
    h.core.stopping = True
    assert h.core.quiet_requests() == 0
    h.core.stopping = False
    h.core.defer_unknown = True
    h.request(model="not_yet_activated")
    assert h.core.quiet_requests() == 0
    h.core.deferred.clear()
    assert h.core.quiet_requests() == ADD_SUB
    h.core.limiter = object()  # type: ignore[assignment]
    assert h.core.quiet_requests() == 0


def _with_batching(**kw: object) -> Harness:
    spec = msgspec.structs.replace(DYNAMIC, **kw)
    h = Harness(models=(spec,))
    h.ready(0, 1)
    return h


@pytest.mark.parametrize(
    "policy",
    [QueuePolicySpec(default_timeout_us=1000), QueuePolicySpec(max_queue_size=8)],
    ids=["timeout", "max_queue_size"],
)
def test_a_model_whose_queue_policy_decides_on_its_own_time_is_never_quiet(
    policy: QueuePolicySpec,
) -> None:
    plain = DYNAMIC.batching
    default = msgspec.structs.replace(plain, default_queue_policy=policy)
    level = msgspec.structs.replace(
        plain, priority_levels=2, default_priority_level=1, priority_queue_policy={2: policy}
    )
    for batching in (default, level):
        assert queue_limits(batching)
        h = _with_batching(batching=batching)
        _busy_both(h)
        assert h.core.quiet_requests() == 0
    assert not queue_limits(plain)


def test_sequence_and_decoupled_models_are_never_quiet() -> None:
    h = _with_batching(decoupled=True)
    _busy_both(h)
    assert h.core.quiet_requests() == 0
    seq = BatchingSpec(kind="sequence", max_batch_size=8)
    h = _with_batching(batching=seq, sequence=SequenceSpec())
    gen = h.core.lifecycle.active[("add_sub", 1)]
    assert not quiet_for_requests(gen, lambda g: False)
    plain = _with_batching().core.lifecycle.active[("add_sub", 1)]
    assert quiet_for_requests(plain, lambda g: False)
    assert not quiet_for_requests(plain, lambda g: True)  # leased to the frontends


def test_a_bucket_shared_with_a_model_that_is_not_quiet_stays_clear() -> None:
    name = next(
        f"m{i}" for i in itertools.count() if model_bucket(f"m{i}") == model_bucket("add_sub")
    )
    h = Harness(models=(DYNAMIC, model_spec(name, (5,))))
    h.ready(0, 1, 5)
    _busy_both(h)
    assert h.core.quiet_requests() == 0  # the same bucket, an idle instance: wake


# ------------------------------------------------------------------ the frontend's side
class FakeRing:
    """Pushes ("push", data), sends ("send", data), wakes ("wake",); ``word``: the quiet
    word the scheduler set; ``reads``: how often it was read."""

    def __init__(self, word: int = 0) -> None:
        self.word = word
        self.reads = 0
        self.log: list[tuple[object, ...]] = []

    def push_quiet(self, data: bytes) -> bool:
        self.log.append(("push", data))
        return True

    def send_bytes(self, data: bytes) -> None:
        self.log.append(("send", data))

    def wake(self) -> None:
        self.log.append(("wake",))

    def quiet_word(self) -> int:
        self.reads += 1
        return self.word

    def wakes(self) -> HeldWakes:
        return HeldWakes(self.push_quiet, self.send_bytes, self.wake, self.quiet_word)


def test_a_request_for_a_quiet_model_goes_without_a_wake_and_others_wake() -> None:
    h = Harness(models=(DYNAMIC, OTHER))
    add, other = _record(h), _record(h, "other_model")
    ring = FakeRing(word=ADD_SUB)
    w = ring.wakes()
    w.send(add)
    assert ring.log == [("push", add)]
    w.send(other)
    assert ring.log[1:] == [("push", other), ("wake",)]
    cancel = encode(
        CancelRequest(reply_to=h.request().reply_to, request_id=1, model="add_sub", version=1)
    )
    w.send(cancel)
    assert ring.log[3:] == [("send", cancel)]  # msgpack: as before, no word read
    assert ring.reads == 2


def test_a_bit_the_caller_gives_is_used_instead_of_the_records() -> None:
    """A known request's template bit (``known_records.keep``) decides the wake; the
    record is not parsed again (a record with no parseable bit goes quietly on it)."""
    h = Harness(models=(DYNAMIC, OTHER))
    add = _record(h)
    ring = FakeRing(word=ADD_SUB)
    w = ring.wakes()
    w.send(add, request_bit(add))
    assert ring.log == [("push", add)]
    w.send(b"not a record", ADD_SUB)
    assert ring.log[1:] == [("push", b"not a record")]
    w.send(add, 0)  # no bit: always wakes (sent as Sender.send_bytes sends)
    assert ring.log[2:] == [("send", add)]
    with w.held():
        w.send(add, model_bit("other_model"))
    assert ring.log[-2:] == [("push", add), ("wake",)]
    none = HeldWakes(ring.push_quiet, ring.send_bytes, ring.wake)
    none.send(add, ADD_SUB)  # no quiet word: the bit is ignored, the request wakes
    assert ring.log[-1] == ("send", add)


def test_held_sends_wake_once_unless_every_request_was_quiet() -> None:
    h = Harness(models=(DYNAMIC, OTHER))
    add, other = _record(h), _record(h, "other_model")
    ring = FakeRing(word=ADD_SUB)
    w = ring.wakes()
    with w.held():
        w.send(add)
        w.send(add)
    assert ring.log == [("push", add), ("push", add)]
    assert ring.reads == 1  # one read, at the end
    with w.held():
        w.send(add)
        w.send(other)
    assert ring.log[2:] == [("push", add), ("push", other), ("wake",)]
    cancel = encode(
        CancelRequest(reply_to=h.request().reply_to, request_id=1, model="add_sub", version=1)
    )
    with w.held():
        w.send(cancel)
    assert ring.log[-1] == ("wake",)
    ring.word = 0  # the scheduler cleared the bit before the end was read
    with w.held():
        w.send(add)
    assert ring.log[-2:] == [("push", add), ("wake",)]


# ------------------------------------------------------------------ the protocol
@pytest.fixture
def channel() -> Iterator[tuple[str, Wakeup]]:
    with ring_channel("qreq", 1 << 16) as made:
        yield made


PRODUCER = ("push", "read_word_and_maybe_post")
CONSUMER = ("clear_bit", "recheck_rings")


def _interleavings() -> Iterator[tuple[str, ...]]:
    for where in itertools.combinations(range(4), 2):
        p, c = iter(PRODUCER), iter(CONSUMER)
        yield tuple(next(p) if i in where else next(c) for i in range(4))


@pytest.mark.parametrize("order", list(_interleavings()), ids="-".join)
def test_no_interleaving_loses_a_requests_wake_up(
    channel: tuple[str, Wakeup], order: tuple[str, ...]
) -> None:
    """The frontend (``HeldWakes.send`` over a real ``Sender``) and the scheduler (clear the
    bit, fence, recheck: ``Router.quiet_requests`` and the loop) in every order: the
    scheduler either finds the request before it sleeps or is posted."""
    ring_name, wakeup = channel
    h = Harness(models=(DYNAMIC,))
    record = _record(h)
    consumer_ring = Ring.attach(ring_name)
    waiter = Waiter(wakeup)
    sender = Sender(ring_name, wakeup)
    consumer_ring.set_quiet_word(ADD_SUB)
    pushed = found = False
    try:
        for step in order:
            if step == "push":
                assert sender.push_quiet(record)
                pushed = True
            elif step == "read_word_and_maybe_post":
                if not ADD_SUB & sender.quiet_word():  # HeldWakes.send's read, fenced
                    sender._waker.wake()
            elif step == "clear_bit":
                consumer_ring.set_quiet_word(0)
                fence()
            else:
                found = consumer_ring.has_records()
        assert pushed
        woken = waiter.wait(0)
        assert found or woken, f"lost wake-up in {order}"
        if order.index("read_word_and_maybe_post") < order.index("clear_bit"):
            assert found  # the recheck alone finds it
            assert not woken
    finally:
        sender.close()
        waiter.close()
        consumer_ring.close()


def test_held_wakes_over_a_real_sender_reads_the_word_the_scheduler_stored(
    channel: tuple[str, Wakeup],
) -> None:
    ring_name, wakeup = channel
    h = Harness(models=(DYNAMIC,))
    record = _record(h)
    consumer_ring = Ring.attach(ring_name)
    waiter = Waiter(wakeup)
    sender = Sender(ring_name, wakeup)
    w = HeldWakes.over(sender, sender._waker.wake)
    try:
        w.send(record)
        assert waiter.wait(0)  # a new ring's word is 0: every request wakes
        consumer_ring.set_quiet_word(ADD_SUB)
        w.send(record)
        assert not waiter.wait(0)
        assert len(consumer_ring.pop_all()) == 2
    finally:
        sender.close()
        waiter.close()
        consumer_ring.close()
