"""``SchedulerCore`` in-process, a decoupled model: its instance idles when ``execute``
returns, its open requests are cancelled at and ended by their worker (the harness of
``test_scheduler_core``)."""

from __future__ import annotations

import msgspec
import pytest

from tests.unit.scheduler_harness import DYNAMIC, Harness, fe, model_spec
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import CancelRequest, DecoupledDone, WorkerDied
from triton_mp.ipc.protocol.specs import BatchingSpec

# --------------------------------------------------------------------------- decoupled

DECOUPLED = msgspec.structs.replace(
    model_spec("repeat", (4,), max_batch_size=0, batching=BatchingSpec()), decoupled=True
)


@pytest.fixture
def hd() -> Harness:
    return Harness(models=(DYNAMIC, DECOUPLED))


def test_decoupled_instance_is_idle_when_execute_returns(hd: Harness) -> None:
    """The instance takes the next request at BatchDone, while the first is still open."""
    hd.ready(4)
    r1 = hd.request("repeat")
    ((_, b1),) = hd.dispatch()
    r2 = hd.request("repeat")
    assert hd.dispatch() == []
    hd.done(4, b1)
    ((_, b2),) = hd.dispatch()
    assert [r.request_id for r in b2.requests] == [r2.request_id]
    assert hd.stats("repeat").inference_count == 1
    del r1


def test_cancel_of_an_open_decoupled_request_goes_to_its_worker(hd: Harness) -> None:
    hd.ready(4)
    r = hd.request("repeat")
    ((_, b),) = hd.dispatch()
    hd.done(4, b)
    cancel = CancelRequest(request_id=r.request_id, reply_to=fe(0), model="repeat", version=1)
    hd.handle(cancel)
    assert hd.to_workers[-1] == (4, cancel)
    assert hd.failures() == []
    # after the final response, a late cancel goes nowhere
    hd.handle(DecoupledDone(instance_id=4, reply_to=fe(0), request_id=r.request_id))
    n = len(hd.to_workers)
    hd.handle(cancel)
    assert len(hd.to_workers) == n


def test_worker_death_ends_open_decoupled_requests_once(hd: Harness) -> None:
    hd.ready(4)
    r1 = hd.request("repeat")
    ((_, b1),) = hd.dispatch()
    hd.done(4, b1)  # r1: execute returned, responses still coming
    r2 = hd.request("repeat")
    hd.dispatch()  # r2: in execute
    r3 = hd.request("repeat")  # waits in the queue
    hd.handle(WorkerDied(instance_id=4, exitcode=-9))
    failed = {m.request_id: m.error for _, m in hd.failures()}
    assert set(failed) == {r1.request_id, r2.request_id}
    assert failed[r1.request_id].code == ErrorCode.UNAVAILABLE
    assert "before the final response" in failed[r1.request_id].message
    assert "while running the request" in failed[r2.request_id].message
    assert r3.request_id not in failed
