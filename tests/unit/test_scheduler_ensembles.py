"""Ensembles in the scheduler core, process-free: composing requests through their model's
own batcher, step answers routed back, blocks freed, statistics, ``triton-mp stat``."""

from __future__ import annotations

import msgspec

from tests.unit.scheduler_harness import DYNAMIC, Harness, tensor
from triton_mp.cli.stat import render_model
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    CancelRequest,
    InferResponse,
    InstancesRetired,
    Requester,
    Shutdown,
    TensorRef,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    EnsembleSpec,
    EnsembleStepSpec,
    ModelVersionSpec,
)

ENS = ModelVersionSpec(
    model="ens",
    version=1,
    backend="",
    model_file="/models/ens",
    max_batch_size=8,
    batching=BatchingSpec(kind="ensemble", max_batch_size=8),
    inputs=(tensor("INPUT0", (16,)), tensor("INPUT1", (16,))),
    outputs=(tensor("OUTPUT0", (16,)),),
    instance_ids=(),
    ensemble=EnsembleSpec(
        steps=(
            EnsembleStepSpec(
                model="add_sub",
                input_map={"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                output_map={"OUTPUT0": "mid"},
            ),
            EnsembleStepSpec(
                model="add_sub",
                input_map={"INPUT0": "mid", "INPUT1": "INPUT1"},
                output_map={"OUTPUT0": "OUTPUT0"},
            ),
        )
    ),
)


def _answer(h: Harness, instance: int, batch, segment: str) -> BlockRef:
    (creq,) = batch.requests
    assert creq.reply_to.kind is Requester.ENSEMBLE
    block = BlockRef(segment, 0)
    out = TensorRef("OUTPUT0", "FP32", (1, 16), segment, 64, 64)
    h.handle(InferResponse(request_id=creq.request_id, version=1, outputs=(out,), block=block))
    h.done(instance, batch)
    return block


def test_an_ensemble_request_runs_its_steps_through_the_composing_batcher() -> None:
    h = Harness(models=(DYNAMIC, ENS))
    h.ready(0, 1)
    req = h.request("ens", client_id="e1")
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    (c1,) = b1.requests
    assert (c1.model, c1.client_id, c1.inputs[0].segment) == (
        "add_sub",
        "e1",
        req.inputs[0].segment,
    )
    (status,) = h.core.queue_status("ens", h.now)
    assert [(s.model, s.in_flight, s.waiting) for s in status.steps] == [
        ("add_sub", 1, 0),
        ("add_sub", 0, 0),
    ]
    assert "ensemble steps" in str(render_model(status).renderables[1].title)
    mid = _answer(h, i1, b1, "/triton_mp_0_w0_a0")
    assert h.freed == []  # step 2 still has to read it
    h.clock.advance_us(200)
    ((i2, b2),) = h.dispatch()
    (c2,) = b2.requests
    assert c2.inputs[0].name == "INPUT0"
    assert c2.inputs[0].segment == "/triton_mp_0_w0_a0"
    last = _answer(h, i2, b2, "/triton_mp_0_w1_a0")
    assert h.freed == [mid]
    (answer,) = [m for _, m in h.to_frontends if isinstance(m, InferResponse)]
    assert answer.request_id == req.request_id
    assert answer.block == last
    assert [t.name for t in answer.outputs] == ["OUTPUT0"]
    ens, add = h.stats("ens"), h.stats("add_sub")
    assert (ens.success.count, ens.execution_count, ens.fail.count) == (1, 1, 0)
    assert ens.compute_infer.ns == 2 * 5_000  # both steps' compute, summed
    assert add.success.count == 2
    assert h.core.idle()


def test_a_step_whose_model_is_gone_fails_the_ensemble_request_and_counts_other() -> None:
    h2 = Harness(models=(ENS,))
    req = h2.request("ens", client_id="x")
    ((_, failed),) = h2.failures()
    assert failed.request_id == req.request_id
    assert failed.error.message == (
        "in ensemble 'ens', Request for unknown model: 'add_sub' has no available versions"
    )
    ens = h2.stats("ens")
    assert (ens.success.count, ens.fail.count, ens.fail_reasons) == (0, 1, {"OTHER": 1})


def test_a_step_model_unloaded_mid_request_still_serves_that_request() -> None:
    """Core ``EnsembleContext`` holds every step's model from the request's start: add_sub
    retired (unloaded) after step 1 was sent still runs step 2 of that request, and its
    instances stop only once the ensemble answered."""
    h = Harness(models=(DYNAMIC, ENS))
    h.ready(0, 1)
    req = h.request("ens", client_id="u1")
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    h.handle(InstancesRetired(instance_ids=(0, 1)))
    _answer(h, i1, b1, "/triton_mp_0_w0_a0")
    h.clock.advance_us(200)
    ((i2, b2),) = h.dispatch()
    assert not [m for _, m in h.to_workers if isinstance(m, Shutdown)]
    _answer(h, i2, b2, "/triton_mp_0_w1_a0")
    (answer,) = [m for _, m in h.to_frontends if isinstance(m, InferResponse)]
    assert answer.request_id == req.request_id
    assert h.failures() == []
    h.dispatch()  # the first pass that sees the retirement idle only arms it
    h.dispatch()
    assert sorted(i for i, m in h.to_workers if isinstance(m, Shutdown)) == [0, 1]
    assert h.core.idle()


def test_a_composing_request_the_scheduler_fails_counts_the_ensemble_failure_once() -> None:
    """A cancelled ensemble request whose step waits in its model's queue: the step fails
    there (counted on add_sub), the ensemble request fails once (not again when the
    step's failure is accounted for)."""
    h = Harness(models=(DYNAMIC, ENS))
    req = h.request("ens", client_id="c1")
    h.handle(
        CancelRequest(request_id=req.request_id, reply_to=req.reply_to, model="ens", version=1)
    )
    h.dispatch()
    ((_, failed),) = h.failures()
    assert failed.request_id == req.request_id
    ens, add = h.stats("ens"), h.stats("add_sub")
    assert (ens.success.count, ens.fail.count, ens.fail_reasons) == (0, 1, {"OTHER": 1})
    assert add.fail.count == 1
    assert h.core.idle()


OUTER = msgspec.structs.replace(
    ENS,
    model="outer",
    ensemble=EnsembleSpec(
        steps=(
            EnsembleStepSpec(
                model="ens",
                input_map={"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                output_map={"OUTPUT0": "OUTPUT0"},
            ),
        )
    ),
)


def test_an_ensemble_step_that_is_an_ensemble_answers_inside_the_scheduler() -> None:
    """An outer ensemble whose step is ``ens``: the inner answer goes back to the outer
    policy (never to a frontend), its blocks travel on with the outer answer, and each
    ensemble counts its one success."""
    h = Harness(models=(DYNAMIC, ENS, OUTER))
    h.ready(0, 1)
    req = h.request("outer", client_id="n")
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    mid = _answer(h, i1, b1, "/triton_mp_0_w0_a0")
    h.clock.advance_us(200)
    ((i2, b2),) = h.dispatch()
    last = _answer(h, i2, b2, "/triton_mp_0_w1_a0")
    (answer,) = [m for _, m in h.to_frontends if isinstance(m, InferResponse)]
    assert answer.request_id == req.request_id
    assert answer.block == last
    assert [t.name for t in answer.outputs] == ["OUTPUT0"]
    assert h.freed == [mid]
    assert [h.stats(m).success.count for m in ("outer", "ens", "add_sub")] == [1, 1, 2]
    assert h.core.idle()
