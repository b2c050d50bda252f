"""An ensemble's steps checked as Triton's core checks them, process-free: a step whose
inputs do not fit its model is never sent, an output a step leaves out is a placeholder, and
a tensor gains or loses its batch dimension between models that batch and models that do
not (``scheduler.rules.step_inputs``, wired in ``scheduler.ensembles``)."""

from __future__ import annotations

import msgspec

from tests.unit.scheduler_harness import DYNAMIC, PLAIN, Harness, tensor
from triton_mp.ipc.protocol.messages import BlockRef, InferResponse, TensorRef
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    EnsembleSpec,
    EnsembleStepSpec,
    ModelVersionSpec,
)


def _ensemble(step_model: str) -> ModelVersionSpec:
    """ens: INPUT0, INPUT1 -> step_model -> mid -> step_model (mid, INPUT1) -> OUTPUT0."""
    return ModelVersionSpec(
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
                    model=step_model,
                    input_map={"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                    output_map={"OUTPUT0": "mid"},
                ),
                EnsembleStepSpec(
                    model=step_model,
                    input_map={"INPUT0": "mid", "INPUT1": "INPUT1"},
                    output_map={"OUTPUT0": "OUTPUT0"},
                ),
            )
        ),
    )


def _answer(h: Harness, instance: int, batch, outputs: tuple[TensorRef, ...], seg: str) -> None:
    (creq,) = batch.requests
    block = BlockRef(seg, 0)
    h.handle(InferResponse(request_id=creq.request_id, version=1, outputs=outputs, block=block))
    h.done(instance, batch)


def test_a_step_output_of_the_wrong_datatype_fails_before_the_next_step_is_sent() -> None:
    h = Harness(models=(DYNAMIC, _ensemble("add_sub")))
    h.ready(0, 1)
    req = h.request("ens", client_id="e1")
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    mid = TensorRef("OUTPUT0", "INT32", (1, 16), "/triton_mp_0_w0_a0", 0, 64)
    _answer(h, i1, b1, (mid,), "/triton_mp_0_w0_a0")
    h.clock.advance_us(200)
    assert h.dispatch() == []
    ((_, failed),) = h.failures()
    assert failed.request_id == req.request_id
    assert failed.error.message == (
        "in ensemble 'ens', [request id: e1] inference input 'INPUT0' data-type is 'INT32', "
        "but model 'add_sub' expects 'FP32'"
    )
    assert h.freed == [BlockRef("/triton_mp_0_w0_a0", 0)]
    ens, add = h.stats("ens"), h.stats("add_sub")
    assert (ens.success.count, ens.fail.count, ens.fail_reasons) == (0, 1, {"OTHER": 1})
    assert (add.success.count, add.fail.count) == (1, 0)  # the refused step never ran
    assert h.core.idle()


def test_a_last_step_that_leaves_the_output_out_answers_with_no_outputs() -> None:
    h = Harness(models=(DYNAMIC, _ensemble("add_sub")))
    h.ready(0, 1)
    req = h.request("ens", client_id="e2")
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    mid = TensorRef("OUTPUT0", "FP32", (1, 16), "/triton_mp_0_w0_a0", 0, 64)
    _answer(h, i1, b1, (mid,), "/triton_mp_0_w0_a0")
    h.clock.advance_us(200)
    ((i2, b2),) = h.dispatch()
    _answer(h, i2, b2, (), "/triton_mp_0_w1_a0")
    (answer,) = [m for _, m in h.to_frontends if isinstance(m, InferResponse)]
    assert (answer.request_id, answer.outputs, answer.empty, answer.final) == (
        req.request_id,
        (),
        False,
        True,
    )
    assert h.stats("ens").success.count == 1
    assert sorted(b.segment for b in h.freed) == ["/triton_mp_0_w0_a0", "/triton_mp_0_w1_a0"]
    assert h.core.idle()


def test_a_batch_of_1_loses_its_batch_dimension_for_a_model_that_does_not_batch() -> None:
    """A batching ensemble's [1,16] is [16] for PLAIN (dims [16], no batching); PLAIN's
    [16] answer is [1,16] again in the ensemble's response (core ReshapeTensorDims)."""
    h = Harness(models=(PLAIN, _ensemble("plain")))
    h.ready(2)
    h.request("ens", client_id="e3")
    ((i1, b1),) = h.dispatch()
    (c1,) = b1.requests
    assert [(t.name, t.shape) for t in c1.inputs] == [("INPUT0", (16,)), ("INPUT1", (16,))]
    mid = TensorRef("OUTPUT0", "FP32", (16,), "/triton_mp_0_w2_a0", 0, 64)
    _answer(h, i1, b1, (mid,), "/triton_mp_0_w2_a0")
    ((i2, b2),) = h.dispatch()
    (c2,) = b2.requests
    assert [t.shape for t in c2.inputs] == [(16,), (16,)]  # mid was made without a batch
    out = msgspec.structs.replace(mid, segment="/triton_mp_0_w2_a1")
    _answer(h, i2, b2, (out,), "/triton_mp_0_w2_a1")
    (answer,) = [m for _, m in h.to_frontends if isinstance(m, InferResponse)]
    assert [(t.name, t.shape) for t in answer.outputs] == [("OUTPUT0", (1, 16))]
    assert h.stats("plain").success.count == 2


def test_an_optional_ensemble_input_left_out_is_a_placeholder_the_step_is_checked_without() -> None:
    """Core's ``AddTensor(nullptr)`` for an optional ensemble input the request leaves
    out: the step runs without it, so add_sub's input count check answers (before, the step
    was never called and the request ended as deadlocked)."""
    optional = msgspec.structs.replace(tensor("INPUT1", (16,)), optional=True)
    spec = _ensemble("add_sub")
    spec = msgspec.structs.replace(spec, inputs=(spec.inputs[0], optional))
    h = Harness(models=(DYNAMIC, spec))
    h.ready(0, 1)
    template = Harness(models=()).request("ens", client_id="e4")
    h.handle(msgspec.structs.replace(template, inputs=template.inputs[:1]))
    assert h.dispatch() == []
    ((_, failed),) = h.failures()
    assert failed.error.message == (
        "in ensemble 'ens', [request id: e4] expected 2 inputs but got 1 inputs for model "
        "'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please "
        "provide all required input(s)."
    )
    assert h.core.idle()


def test_outputs_come_in_triton_s_unordered_map_order_whatever_the_request_asked() -> None:
    """core CheckAndSetEnsembleOutput walks an unordered_map of the config's outputs: for
    OUTPUT0 and mid that is mid first (2.51 lists ens_pair's B before A the same way)."""
    spec = _ensemble("add_sub")
    spec = msgspec.structs.replace(spec, outputs=(*spec.outputs, tensor("mid", (16,))))
    h = Harness(models=(DYNAMIC, spec))
    h.ready(0, 1)
    template = Harness(models=()).request("ens", client_id="e5")
    h.handle(msgspec.structs.replace(template, outputs=("OUTPUT0", "mid")))
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    mid = TensorRef("OUTPUT0", "FP32", (1, 16), "/triton_mp_0_w0_a0", 0, 64)
    _answer(h, i1, b1, (mid,), "/triton_mp_0_w0_a0")
    h.clock.advance_us(200)
    ((i2, b2),) = h.dispatch()
    out = TensorRef("OUTPUT0", "FP32", (1, 16), "/triton_mp_0_w1_a0", 0, 64)
    _answer(h, i2, b2, (out,), "/triton_mp_0_w1_a0")
    (answer,) = [m for _, m in h.to_frontends if isinstance(m, InferResponse)]
    assert [t.name for t in answer.outputs] == ["mid", "OUTPUT0"]
