"""An ensemble step's request as Triton's core builds and checks it, before it is sent.

Imported by ``scheduler.ensembles``. Triton builds each composing request from the tensors
the ensemble holds (``ensemble_scheduler.cc`` ``InitStep``) and normalizes it as any other
request (``PrepareForInference``, then ``infer_request.cc`` ``Normalize``): a step whose
inputs do not fit its model's config is never called, and the ensemble request fails with
the check's message (prefixed "in ensemble '<name>', " by the policy). Pure: no ipc
messages are sent, no clock.

- ``reshape_dims``: core ``ReshapeTensorDims``, the batch dimension a tensor gains (or
  loses) between a model that batches and one that does not.
- ``apply_reshape``: an ensemble input's config ``reshape``, which core applies to the
  request's input (``Normalize``) before the ensemble hands it to its steps.
- ``check_step``: core ``Normalize``'s checks in its order and words (``common.
  input_checks``): the number of inputs, that the model has each, every input's batch
  dimension, the batch size,
  then each input's datatype and shape (against ``dims``, not ``reshape``: the worker
  applies ``reshape``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from triton_mp.common.errors import InvalidRequest
from triton_mp.common.input_checks import (
    batch_mismatch_message,
    batch_too_big_message,
    compare_with_wildcard,
    count_message,
    datatype_message,
    no_batch_dim_message,
    shape_problem,
    unknown_input_message,
)
from triton_mp.common.unordered import iteration_order


class InputConfig(Protocol):
    """A model input's config, as ``ipc.protocol.specs.TensorSpec`` holds it."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def dims(self) -> tuple[int, ...]: ...
    @property
    def optional(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class StepInput:
    """One input of a step's request, as the ensemble holds it.

    Attributes:
        name: the composing model's input name.
        datatype: protocol datatype string; ``shape``: its full shape (as reshaped by
            ``reshape_dims``).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]


def reshape_dims(
    dims: Sequence[int], batching: bool, tensor_batch: int, shape: tuple[int, ...]
) -> tuple[int, ...]:
    """A tensor's shape for a model (or ensemble output) with config ``dims``.

    Args:
        batching: the model (or the ensemble request) batches (``max_batch_size`` > 0).
        tensor_batch: the batch size of the request that made the tensor: 0 when that
            model (or ensemble) does not batch.

    Returns:
        ``shape`` with a batch dimension of 1 prepended (a tensor from a model that does not
        batch, for one that does, when its shape fits ``dims``), without its batch
        dimension (a tensor of batch 1 for a model that does not batch, when its shape does
        not fit ``dims``), else as it is.
    """
    if batching == (tensor_batch != 0):
        return shape
    if batching:
        return (1, *shape) if compare_with_wildcard(dims, shape) else shape
    if not compare_with_wildcard(dims, shape) and tensor_batch == 1:
        return shape[1:]
    return shape


def apply_reshape(
    dims: Sequence[int], reshape: Sequence[int], shape: tuple[int, ...]
) -> tuple[int, ...]:
    """A shape that fits config ``dims`` (no batch dimension) as config ``reshape`` has it:
    each -1 of ``reshape`` takes the size of the next -1 of ``dims`` (core ``Normalize``)."""
    if len(dims) != len(shape):
        return shape  # NOTE: the frontend refused such a request already
    variable = iter([s for d, s in zip(dims, shape, strict=True) if d == -1])
    return tuple(next(variable) if d == -1 else d for d in reshape)


def check_step(
    model: str,
    max_batch_size: int,
    configs: Sequence[InputConfig],
    inputs: Sequence[StepInput],
    rid: str,
) -> int:
    """Core ``Normalize`` of a step's request (the inputs the ensemble has for it).

    Args:
        model, max_batch_size, configs: the composing model's name, ``max_batch_size`` and
            inputs (``ModelVersionSpec``).
        inputs: the inputs set (a step output the model before did not produce is absent).
        rid: the ``[request id: <id>] `` prefix.

    Returns:
        The request's batch size: the inputs' leading dimension when the model batches,
        else 0.

    Raises:
        InvalidRequest: the first check that fails, in Triton's words.
    """
    mbs = max_batch_size
    required = [t.name for t in configs if not t.optional]
    names = [t.name for t in inputs]
    if not len(required) <= len(inputs) <= len(configs):
        raise InvalidRequest(count_message(rid, model, names, required, len(configs)))
    by_config = {t.name: t for t in configs}
    # NOTE: Triton walks the request's inputs in its unordered_map's order.
    by_name = {t.name: t for t in inputs}
    ordered = [by_name[n] for n in iteration_order(names)]
    for t in ordered:
        if t.name not in by_config:
            # NOTE: a step model reloaded without an input the ensemble maps.
            raise InvalidRequest(unknown_input_message(t.name, model))
    batch = 0
    if mbs > 0:
        for t in ordered:
            if not t.shape:
                raise InvalidRequest(no_batch_dim_message(rid, t.name, model))
            if batch == 0:
                batch = t.shape[0]
            elif t.shape[0] != batch:
                raise InvalidRequest(batch_mismatch_message(rid, t.name, model))
        if batch > mbs:
            raise InvalidRequest(batch_too_big_message(rid, mbs, model))
    for t in ordered:
        config = by_config[t.name]
        if t.datatype != config.datatype:
            raise InvalidRequest(datatype_message(rid, t.name, t.datatype, model, config.datatype))
        item = t.shape[1:] if mbs > 0 else t.shape
        problem = shape_problem(rid, t.name, model, config.dims, item, t.shape, mbs > 0)
        if problem is not None:
            raise InvalidRequest(problem)
        # NOTE: no byte-size check (core's last): a step tensor's bytes were written by
        # the worker that made it from an array of this shape and datatype (BYTES: one
        # serialised element per element of the shape), and reshape_dims keeps the count.
    return batch
