"""An ensemble step's request as Triton's core builds and checks it (``scheduler.
step_inputs``): ``ReshapeTensorDims`` and ``Normalize``'s checks, order and words."""

from __future__ import annotations

import pytest

from triton_mp.common.errors import InvalidRequest
from triton_mp.common.input_checks import BATCH_NOTE
from triton_mp.common.unordered import iteration_order
from triton_mp.ipc.protocol.specs import TensorSpec
from triton_mp.scheduler.rules.step_inputs import StepInput, apply_reshape, check_step, reshape_dims

RID = "[request id: r1] "


@pytest.mark.parametrize(
    ("dims", "batching", "tensor_batch", "shape", "expected"),
    [
        ((-1,), True, 0, (3,), (1, 3)),  # fits dims: a batch of 1 is prepended
        ((-1,), True, 0, (2, 3), (2, 3)),  # does not fit: taken as already batched
        ((-1,), False, 1, (1, 3), (3,)),  # batch of 1 that does not fit: stripped
        ((-1, -1), False, 1, (1, 3), (1, 3)),  # fits as it is: kept
        ((-1,), False, 2, (2, 3), (2, 3)),  # a batch of 2 is never stripped
        ((-1,), True, 4, (4, 3), (4, 3)),  # both batch: unchanged
        ((-1,), False, 0, (1, 3), (1, 3)),  # neither batches: unchanged
        ((3,), True, 0, (-1,), (1, -1)),  # CompareDimsWithWildcard: -1 on either side
    ],
)
def test_reshape_dims_is_core_reshape_tensor_dims(
    dims: tuple[int, ...],
    batching: bool,
    tensor_batch: int,
    shape: tuple[int, ...],
    expected: tuple[int, ...],
) -> None:
    assert reshape_dims(dims, batching, tensor_batch, shape) == expected


def _spec(name: str, dims: tuple[int, ...], datatype: str = "FP32", optional: bool = False):
    return TensorSpec(name=name, datatype=datatype, dims=dims, optional=optional)


FLEX = ("flex", 0, (_spec("IN", (-1,)),))
PAIR = ("pair", 4, (_spec("A", (2,)), _spec("B", (2,), "INT32")))


def _message(model: tuple, *inputs: StepInput) -> str:
    with pytest.raises(InvalidRequest) as info:
        check_step(*model, inputs, RID)
    return info.value.message


def test_a_fitting_step_request_passes_with_its_batch_size() -> None:
    assert check_step(*FLEX, [StepInput("IN", "FP32", (3,))], RID) == 0
    a, b = StepInput("A", "FP32", (3, 2)), StepInput("B", "INT32", (3, 2))
    assert check_step(*PAIR, [a, b], RID) == 3


def test_datatype_and_shape_are_refused_in_triton_s_words() -> None:
    assert _message(FLEX, StepInput("IN", "INT32", (3,))) == (
        RID + "inference input 'IN' data-type is 'INT32', but model 'flex' expects 'FP32'"
    )
    assert _message(FLEX, StepInput("IN", "FP32", (2, 3))) == (
        RID + "unexpected shape for input 'IN' for model 'flex'. Expected [-1], got [2,3]. "
    )
    assert _message(PAIR, StepInput("A", "FP32", (1, 3)), StepInput("B", "INT32", (1, 2))) == (
        RID
        + "unexpected shape for input 'A' for model 'pair'. Expected [-1,2], got [1,3]. "
        + BATCH_NOTE
    )


def test_a_missing_input_is_the_input_count_message() -> None:
    assert _message(FLEX) == (
        RID + "expected 1 inputs but got 0 inputs for model 'flex'. Got input(s) [], but "
        "missing required input(s) ['IN']. Please provide all required input(s)."
    )
    optional = ("opt", 0, (_spec("IN", (-1,)), _spec("EXTRA", (-1,), optional=True)))
    assert check_step(*optional, [StepInput("IN", "FP32", (3,))], RID) == 0
    assert _message(optional) == (
        RID + "expected number of inputs between 1 and 2 but got 0 inputs for model 'opt'. "
        "Got input(s) [], but missing required input(s) ['IN']. Please provide all required "
        "input(s)."
    )


def test_batch_checks_come_before_any_datatype_check() -> None:
    """Normalize checks every input's batch dimension, then the batch size, then each
    input's datatype and shape."""
    bad_type = StepInput("A", "INT8", (3, 2))
    assert _message(PAIR, bad_type, StepInput("B", "INT32", ())) == (
        RID + "input 'B' has no shape but model requires batch dimension for 'pair'"
    )
    # NOTE: the first input in unordered_map order sets the batch; the other mismatches.
    _, second = iteration_order(["A", "B"])
    assert _message(PAIR, bad_type, StepInput("B", "INT32", (2, 2))) == (
        RID + f"input '{second}' batch size does not match other inputs for 'pair'"
    )
    big = StepInput("B", "INT32", (5, 2))
    assert _message(PAIR, StepInput("A", "INT8", (5, 2)), big) == (
        RID + "inference request batch-size must be <= 4 for 'pair'"
    )


def test_an_input_the_model_no_longer_has_is_unexpected() -> None:
    assert _message(FLEX, StepInput("OLD", "FP32", (3,))) == (
        "unexpected inference input 'OLD' for model 'flex'"
    )


def test_a_wildcard_in_the_shape_is_all_dimensions_should_be_specified() -> None:
    assert _message(FLEX, StepInput("IN", "FP32", (-1,))) == (
        RID + "All input dimensions should be specified for input 'IN' for model 'flex', got [-1]"
    )


def test_apply_reshape_fills_each_wildcard_of_reshape_from_the_next_of_dims() -> None:
    assert apply_reshape((2, 3), (6,), (2, 3)) == (6,)
    assert apply_reshape((-1, 3), (-1,), (4, 3)) == (4,)
    assert apply_reshape((-1, 2, -1), (-1, 1, -1, 2), (5, 2, 7)) == (5, 1, 7, 2)
    assert apply_reshape((1,), (), (1,)) == ()
