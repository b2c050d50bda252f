"""BLS follows model changes: the rings a change adds or removes (``plan_bls_add``,
``plan_bls_remove``), the table of models a BLS client may call (``bls_table``), the order in
which a worker applies the supervisor's BLS updates, and an inbox that gains and loses rings
at run time."""

from __future__ import annotations

import os
from collections.abc import Iterator

import posix_ipc
import pytest

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc import Inbox, Sender
from triton_mp.ipc.memory.notify import Wakeup, create_wakeup
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BlsModel,
    BlsWorkerUpdate,
    CancelRequest,
    ErrorInfo,
    ReplyTo,
    Requester,
    RequestFailed,
    Shutdown,
    ToFrontend,
    ToWorker,
)
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, TensorSpec
from triton_mp.supervisor.processes.bls_wiring import bls_table, plan_bls_add, plan_bls_remove
from triton_mp.workers.main import control_first


def _version(
    model: str, version: int, outputs: tuple[str, ...], instances: int, mbs: int = 0
) -> ModelVersionSpec:
    return ModelVersionSpec(
        model=model,
        version=version,
        backend="python",
        model_file="model.py",
        max_batch_size=mbs,
        batching=BatchingSpec(max_batch_size=mbs),
        inputs=(),
        outputs=tuple(TensorSpec(name=o, datatype="FP32", dims=(16,)) for o in outputs),
        instance_ids=tuple(range(100 * version, 100 * version + instances)),
    )


def test_table_lists_versions_ascending_with_the_newest_versions_shape() -> None:
    table = bls_table(
        [
            _version("m", 3, ("NEW",), instances=2, mbs=8),
            _version("m", 1, ("OLD",), instances=1),
            _version("other", 1, ("OUT",), instances=1),
        ]
    )
    assert table == {
        "m": BlsModel(versions=(1, 3), max_batch_size=8, outputs=("NEW",), instance_count=2),
        "other": BlsModel(versions=(1,), max_batch_size=0, outputs=("OUT",), instance_count=1),
    }


def test_table_of_nothing_served_is_empty() -> None:
    assert bls_table([]) == {}


def test_a_worker_applies_the_supervisors_bls_updates_before_the_batches_of_a_drain() -> None:
    batch = BatchAssign(batch_id=1, requests=(), dispatch_ns=0)
    cancel = CancelRequest(request_id=1, reply_to=ReplyTo(Requester.BLS, 3), model="m", version=1)
    first = BlsWorkerUpdate(instance_id=4, seq=2, models={})
    second = BlsWorkerUpdate(instance_id=4, remove_clients=(7,))
    drained: list[ToWorker] = [batch, cancel, Shutdown(), first, second]
    assert control_first(drained) == [first, second, cancel, batch, Shutdown()]
    # NOTE: a cancellation drained with its batch is applied first: is_cancelled() is true
    # from the start of that execute.
    assert control_first([batch, cancel]) == [cancel, batch]
    for alone in ([batch], [cancel], []):
        assert control_first(alone) == alone  # NOTE: one message has no order to fix


def test_new_instances_answer_every_client_and_running_ones_each_new_client() -> None:
    # Running: 0 (onnx), 1 (python). New: 2 (onnx), 3 (python).
    plan = plan_bls_add(running=[0, 1], running_clients=[1], new=[2, 3], new_clients=[3])
    assert plan.rings == ((2, 1), (2, 3), (3, 1), (3, 3), (0, 3), (1, 3))
    assert plan.answers_of_new == {2: (1, 3), 3: (1, 3)}
    assert plan.inbox_of_new_client == {3: (0, 1, 2, 3)}
    assert plan.worker_gains == {0: (3,), 1: (3,)}
    assert plan.inbox_gains == {1: (2, 3)}


def test_without_python_instances_no_ring_is_planned() -> None:
    plan = plan_bls_add(running=[0], running_clients=[], new=[1, 2], new_clients=[])
    assert plan.rings == ()
    assert plan.answers_of_new == {1: (), 2: ()}
    assert plan.worker_gains == {}
    assert plan.inbox_gains == {}


def test_the_first_python_instance_answers_itself() -> None:
    plan = plan_bls_add(running=[], running_clients=[], new=[5], new_clients=[5])
    assert plan.rings == ((5, 5),)
    assert plan.inbox_of_new_client == {5: (5,)}


def test_stopped_instances_leave_every_remaining_worker_and_client() -> None:
    plan = plan_bls_remove(
        remaining=[0, 1], remaining_clients=[1], gone=[4, 2], gone_clients=[4, 2]
    )
    assert plan.worker_losses == {0: (2, 4), 1: (2, 4)}
    assert plan.inbox_losses == {1: (4, 2)}
    quiet = plan_bls_remove(remaining=[0], remaining_clients=[], gone=[3], gone_clients=[])
    assert quiet.worker_losses == {}
    assert quiet.inbox_losses == {}


@pytest.fixture
def wakeup() -> Iterator[Wakeup]:
    w = create_wakeup("semaphore", f"/triton_mp_{os.getpid()}_test_bls_sem")
    yield w
    unlink_quietly(w.name)


@pytest.fixture
def rings() -> Iterator[list[str]]:
    names = [f"/triton_mp_{os.getpid()}_test_bls_ring{i}" for i in range(3)]
    created = [Ring.create(n, 4096) for n in names]
    yield names
    for r in created:
        r.close()
    for n in names:
        unlink_quietly(n)


def test_inbox_gains_a_ring_once_and_gives_back_what_a_removed_ring_held(
    wakeup: Wakeup, rings: list[str]
) -> None:
    inbox: Inbox[ToFrontend] = Inbox(wakeup, rings[:1], ToFrontend)
    try:
        assert not inbox.has_ring(rings[1])
        inbox.add_ring(rings[1])
        inbox.add_ring(rings[1])  # twice: still one ring (a replayed update)
        assert inbox.has_ring(rings[1].lstrip("/"))
        sender = Sender(rings[1], wakeup)
        answer = RequestFailed(request_id=5, error=ErrorInfo(ErrorCode.UNAVAILABLE, "x"))
        sender.send(answer)
        sender.send(answer)
        assert inbox.drain() == [answer, answer]
        sender.send(answer)
        assert inbox.remove_ring(rings[1]) == [answer]
        assert not inbox.has_ring(rings[1])
        assert inbox.remove_ring(rings[1]) == []
        sender.close()
        unlink_quietly(rings[2])
        with pytest.raises(posix_ipc.ExistentialError):
            inbox.add_ring(rings[2])
    finally:
        inbox.close()


def test_the_table_names_versions_known_but_not_served() -> None:
    """Failed, retired and unloaded versions: a BLS call naming one is UNAVAILABLE "... is
    not at ready state" (workers.bls.bls_client), as the frontend answers."""
    table = bls_table([], {"gone": {1, 2}, "never": set()})
    assert set(table) == {"gone"}
    assert (table["gone"].versions, table["gone"].unavailable) == ((), (1, 2))
