"""The worker process's loop (``workers.main``): what a starting worker replays, what each
message does, and when the loop stops. No process, ring or backend: fakes stand for them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BlockRef,
    BlsClientWiring,
    BlsWorkerUpdate,
    CancelRequest,
    DropSegments,
    InferRequest,
    ReplyTo,
    Requester,
    Shutdown,
    ToWorker,
)
from triton_mp.ipc.protocol.specs import FRONTEND_ID_RANGE
from triton_mp.workers.main import cancel_now, handle, replayed_on_start, serve
from triton_mp.workers.worker import Worker


class FakeWorker:
    def __init__(self) -> None:
        self.did: list[tuple[str, int]] = []

    def run_batch(self, batch: BatchAssign) -> None:
        self.did.append(("batch", batch.batch_id))

    def cancel(self, msg: CancelRequest) -> None:
        self.did.append(("cancel", msg.request_id))

    def frontend_gone(self, msg: DropSegments) -> None:
        self.did.append(("gone", msg.frontend_id))

    def drop_segments(self, prefixes: tuple[str, ...], holder: int = 0) -> None:
        self.did.append(("drop", holder))


class FakeInbox:
    """Hands out one list of messages per drain; waits never block."""

    def __init__(self, *drains: list[ToWorker]) -> None:
        self._drains = list(drains)
        self.waits = 0

    def wait(self, timeout: float | None) -> bool:
        self.waits += 1
        return True

    def drain(self) -> list[ToWorker]:
        return self._drains.pop(0)


def _batch(batch_id: int) -> BatchAssign:
    return BatchAssign(batch_id=batch_id, requests=(), dispatch_ns=0)


def _cancel(request_id: int) -> CancelRequest:
    return CancelRequest(
        request_id=request_id, reply_to=ReplyTo(Requester.FRONTEND, 1), model="m", version=1
    )


def _update(seq: int) -> BlsWorkerUpdate:
    wiring = BlsClientWiring(instance_id=seq, ring=f"/r{seq}", wakeup=None)  # type: ignore[arg-type]
    return BlsWorkerUpdate(instance_id=0, add_clients=(wiring,), seq=seq)


def test_a_starting_worker_replays_bls_updates_only_in_order() -> None:
    left: list[ToWorker] = [_batch(1), _update(1), _cancel(5), Shutdown(), _update(2)]
    assert [u.seq for u in replayed_on_start(left)] == [1, 2]


def test_each_message_goes_where_it_belongs() -> None:
    worker = FakeWorker()
    rewired: list[int] = []
    w: Any = worker
    assert not handle(_batch(3), w, lambda u: rewired.append(u.seq))
    assert not handle(_cancel(9), w, lambda u: rewired.append(u.seq))
    assert not handle(_update(4), w, lambda u: rewired.append(u.seq))
    assert handle(Shutdown(), w, lambda u: rewired.append(u.seq))
    assert worker.did == [("batch", 3), ("cancel", 9)]
    assert rewired == [4]


def test_the_loop_stops_after_the_drain_that_held_shutdown() -> None:
    worker = FakeWorker()
    inbox = FakeInbox([_batch(1)], [_batch(2), Shutdown(), _batch(3)], [_batch(4)])
    w: Any = worker
    i: Any = inbox
    assert serve(i, w, lambda u: None) == 0.0  # a server shutdown: no wait for readers
    # NOTE: batch 3 came in the same drain as the Shutdown: it still runs; batch 4 never.
    assert worker.did == [("batch", 1), ("batch", 2), ("batch", 3)]
    assert inbox.waits == 2


def test_the_bls_updates_of_a_drain_apply_before_its_batches() -> None:
    worker = FakeWorker()
    order: list[object] = []
    inbox = FakeInbox([_batch(1), _update(7), Shutdown()])
    w: Any = worker
    i: Any = inbox

    def rewire(u: BlsWorkerUpdate) -> None:
        order.append(("update", u.seq, list(worker.did)))

    serve(i, w, rewire)
    # NOTE: the update came from the supervisor's ring, drained after the scheduler's.
    assert order == [("update", 7, [])]
    assert worker.did == [("batch", 1)]


def test_the_loop_returns_how_long_a_retired_instance_waits_for_its_readers() -> None:
    inbox = FakeInbox([_batch(1), Shutdown(readers_s=10.0)])
    w: Any = FakeWorker()
    i: Any = inbox
    assert serve(i, w, lambda u: None) == 10.0


def _dead(frontend_id: int, below: int) -> DropSegments:
    return DropSegments(prefixes=("/p",), holder=77, frontend_id=frontend_id, requests_below=below)


def test_a_dead_frontend_cancels_at_once_and_its_arenas_go_in_the_loop() -> None:
    """During a batch the watch applies the cancellation and keeps the message; the loop
    then applies both (again: idempotent) and unmaps."""
    worker = FakeWorker()
    w: Any = worker
    assert not cancel_now(w)(_dead(1, 5))
    assert worker.did == [("gone", 1)]
    assert not handle(_dead(1, 5), w, lambda u: None)
    assert worker.did == [("gone", 1), ("gone", 1), ("drop", 77)]


def _request(frontend_id: int, request_id: int, kind: Requester = Requester.FRONTEND) -> Any:
    return InferRequest(
        request_id=request_id,
        reply_to=ReplyTo(kind, frontend_id),
        model="m",
        version=1,
        batch_size=1,
        inputs=(),
        outputs=(),
        block=BlockRef("/a", 0),
        arrival_ns=0,
    )


def test_a_dead_frontends_requests_count_as_cancelled_and_no_others() -> None:
    """``Worker.is_cancelled`` after ``frontend_gone``: the requests of frontend 1 with ids
    below its next process's first; not its new process's, not frontend 0's, not a BLS
    client 1's; an older (smaller) bound arriving late lowers nothing."""
    worker: Any = SimpleNamespace(watch=None, _cancelled=set(), _gone_below={})
    second = FRONTEND_ID_RANGE + 1
    old, new = _request(1, 5), _request(1, second)
    assert not Worker.is_cancelled(worker, old)
    Worker.frontend_gone(worker, _dead(1, second))
    assert Worker.is_cancelled(worker, old)
    assert Worker.is_cancelled(worker, _request(1, second - 1))
    assert not Worker.is_cancelled(worker, new)
    assert not Worker.is_cancelled(worker, _request(0, 5))
    assert not Worker.is_cancelled(worker, _request(1, 5, Requester.BLS))
    Worker.frontend_gone(worker, _dead(1, 1))
    assert Worker.is_cancelled(worker, old)
    Worker.frontend_gone(worker, _dead(-1, 2 * second))
    assert not Worker.is_cancelled(worker, new)
    Worker.frontend_gone(worker, _dead(1, 2 * FRONTEND_ID_RANGE + 1))
    assert Worker.is_cancelled(worker, new)
