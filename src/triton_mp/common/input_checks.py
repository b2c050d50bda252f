"""Triton's input checks of a request against a model's config: the messages, and the checks
that need only names, datatypes and shapes.

Imported by ``frontend.validation.inputs`` (a client's request) and ``scheduler.rules.step_inputs``
(an ensemble step's request, which Triton's core normalizes as any other). Words and order
follow core ``infer_request.cc`` (``Normalize``, ``ValidateRequestInputs``); ``rid`` is the
request's ``[request id: <id>] `` prefix (core ``LogRequest``). Pure: no numpy, no ipc.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from triton_mp.common.unordered import iteration_order

BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
    "dimension to be prepended to each input shape. If you want to specify the full "
    "shape including the batch dim in your input dims config, try setting "
    "max_batch_size to zero. See the model configuration docs for more info on "
    "max_batch_size."
)
"""The end of "unexpected shape ..." for a batching model (empty for the others)."""


def fmt_shape(shape: Sequence[int]) -> str:
    """A shape as Triton prints it (``DimsListToString``): ``[1,2,3]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def dims_match(dims: Sequence[int], shape: Sequence[int]) -> bool:
    """``shape`` (no batch dimension) fits config ``dims`` (-1 = any size)."""
    return len(dims) == len(shape) and all(
        d == -1 or d == s for d, s in zip(dims, shape, strict=True)
    )


def compare_with_wildcard(dims: Sequence[int], shape: Sequence[int]) -> bool:
    """Common ``CompareDimsWithWildcard``: same rank, and each pair equal or either -1."""
    return len(dims) == len(shape) and all(
        d == -1 or s == -1 or d == s for d, s in zip(dims, shape, strict=True)
    )


def count_message(
    rid: str, model: str, given: Iterable[str], required: Sequence[str], total: int
) -> str:
    """Triton's "expected N inputs but got M inputs ..." (``ValidateRequestInputs``).

    Args:
        given: the request's input names (listed in libstdc++ ``unordered_map`` order).
        required: the model's non-optional inputs, in config order.
        total: the model's number of inputs.
    """
    names = list(given)
    got = ",".join(f"'{n}'" for n in iteration_order(names))
    miss = "[" + ",".join(f"'{n}'" for n in required if n not in names)
    # NOTE: Triton drops the list's last character to cut a trailing comma: with none
    # missing that is the "[" itself.
    miss = miss[:-1] + "]" if len(miss) == 1 else miss + "]"
    if len(required) == total:
        head = f"expected {total} inputs but got {len(names)} inputs"
    else:
        head = (
            f"expected number of inputs between {len(required)} and {total} "
            f"but got {len(names)} inputs"
        )
    return (
        f"{rid}{head} for model '{model}'. Got input(s) [{got}], but missing required "
        f"input(s) {miss}. Please provide all required input(s)."
    )


def unknown_input_message(name: str, model: str) -> str:
    """An input the model does not have (core ``Model::GetInput``: no request id)."""
    return f"unexpected inference input '{name}' for model '{model}'"


def datatype_message(rid: str, name: str, got: str, model: str, expected: str) -> str:
    """An input whose datatype is not the config's (``got``: as Triton prints it)."""
    return (
        f"{rid}inference input '{name}' data-type is '{got}', but model '{model}' expects "
        f"'{expected}'"
    )


def no_batch_dim_message(rid: str, name: str, model: str) -> str:
    """A scalar input of a batching model."""
    return f"{rid}input '{name}' has no shape but model requires batch dimension for '{model}'"


def batch_mismatch_message(rid: str, name: str, model: str) -> str:
    """An input whose leading dimension is not the first input's."""
    return f"{rid}input '{name}' batch size does not match other inputs for '{model}'"


def batch_too_big_message(rid: str, max_batch_size: int, model: str) -> str:
    """A batch over the model's ``max_batch_size``."""
    return f"{rid}inference request batch-size must be <= {max_batch_size} for '{model}'"


def shape_problem(
    rid: str,
    name: str,
    model: str,
    dims: Sequence[int],
    item_shape: Sequence[int],
    shape: Sequence[int],
    batching: bool,
) -> str | None:
    """The message for an input's shape that does not fit config ``dims``, or None.

    Args:
        item_shape: the shape without the batch dimension (``shape`` for a model that does
            not batch); ``shape``: the full shape, as the request gave it (printed).
        batching: the model's ``max_batch_size`` > 0 (the expected shape starts with -1).
    """
    if len(dims) == len(item_shape):
        # NOTE: core Normalize compares dim by dim and stops at the first mismatch; a -1
        # reached first is "All input dimensions should be specified".
        for d, s in zip(dims, item_shape, strict=True):
            if s == -1:
                return (
                    f"{rid}All input dimensions should be specified for input '{name}' for "
                    f"model '{model}', got {fmt_shape(shape)}"
                )
            if d not in (-1, s):
                break
    if dims_match(dims, item_shape):
        return None
    expected = ([-1] if batching else []) + list(dims)
    return (
        f"{rid}unexpected shape for input '{name}' for model '{model}'. Expected "
        f"{fmt_shape(expected)}, got {fmt_shape(shape)}. {BATCH_NOTE if batching else ''}"
    )


def byte_size_message(rid: str, name: str, model: str, expected: int, got: int) -> str:
    """An input whose bytes are not its shape's. ``expected`` is worded as core's int64
    ``GetByteSize`` holds it: a size of 2**63 bytes or more wraps (``[2**61]`` FP32 elements
    read "-9223372036854775808")."""
    wrapped = (expected + 2**63) % 2**64 - 2**63
    return (
        f"{rid}input byte size mismatch for input '{name}' for model '{model}'. "
        f"Expected {wrapped}, got {got}"
    )
