"""The worker process's loop (``workers.main``): what a starting worker replays, what each
message does, and when the loop stops. No process, ring or backend: fakes stand for them."""

from __future__ import annotations

from typing import Any

from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BlsClientWiring,
    BlsWorkerUpdate,
    CancelRequest,
    ReplyTo,
    Requester,
    Shutdown,
    ToWorker,
)
from triton_mp.workers.main import handle, replayed_on_start, serve


class FakeWorker:
    def __init__(self) -> None:
        self.did: list[tuple[str, int]] = []

    def run_batch(self, batch: BatchAssign) -> None:
        self.did.append(("batch", batch.batch_id))

    def cancel(self, msg: CancelRequest) -> None:
        self.did.append(("cancel", msg.request_id))


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
