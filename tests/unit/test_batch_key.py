"""Which requests may share a batch (``scheduler.instances.Generation.batch_key``), as core's
``RequiredEqualInputs``: equal shapes of the variable, non-ragged inputs, and for a model
with optional inputs the same set of inputs."""

from __future__ import annotations

import msgspec

from tests.unit.scheduler_harness import model_spec
from triton_mp.ipc.protocol.messages import TensorRef
from triton_mp.ipc.protocol.specs import TensorSpec
from triton_mp.scheduler.instances import Generation
from triton_mp.scheduler.registry import make_policy


def _gen(*inputs: TensorSpec) -> Generation:
    spec = msgspec.structs.replace(model_spec("m", (0,)), inputs=inputs)
    return Generation(spec, make_policy(spec), spec.enforced_inputs, spec.has_optional_inputs)


def _t(name: str, *shape: int) -> TensorRef:
    return TensorRef(name, "FP32", shape, "seg", 0, 4)


A, B = (
    TensorSpec(name="A", datatype="FP32", dims=(4,)),
    TensorSpec(name="B", datatype="FP32", dims=(-1,)),
)


def test_fixed_inputs_batch_with_anything() -> None:
    gen = _gen(A)
    assert gen.batch_key([_t("A", 1, 4)]) == gen.batch_key([_t("A", 3, 4)]) == ()


def test_variable_inputs_must_agree_by_name_whatever_the_order() -> None:
    gen = _gen(A, B)
    one = gen.batch_key([_t("A", 1, 4), _t("B", 1, 7)])
    assert one == gen.batch_key([_t("B", 2, 7), _t("A", 2, 4)])  # batch sizes may differ
    assert one != gen.batch_key([_t("A", 1, 4), _t("B", 1, 8)])
    ragged = _gen(A, TensorSpec(name="B", datatype="FP32", dims=(-1,), allow_ragged_batch=True))
    assert ragged.batch_key([_t("B", 1, 7)]) == ragged.batch_key([_t("B", 1, 8)])


def test_with_optional_inputs_the_same_inputs_must_be_given() -> None:
    gen = _gen(A, TensorSpec(name="C", datatype="FP32", dims=(4,), optional=True))
    both = gen.batch_key([_t("A", 1, 4), _t("C", 1, 4)])
    assert both == gen.batch_key([_t("C", 2, 4), _t("A", 2, 4)])
    assert both != gen.batch_key([_t("A", 1, 4)])
    assert gen.batch_key([_t("A", 1, 4)]) != gen.batch_key([_t("C", 1, 4)])
    assert gen.batch_key([_t("A", 1, 4)]) == gen.batch_key([_t("A", 5, 4)])
