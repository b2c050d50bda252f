"""An ensemble's tensors and blocks as the ipc messages carry them.

Imported by ``scheduler.ensembles``. The ensemble policy (``policies.ensemble``) moves opaque
values and blocks; here they are a ``TensorRef`` with the batch size of the request that
made it (``Value``) and arena blocks (a nested ensemble's response: ``Blocks``). The
functions shape them as Triton's core does: an ensemble input with its config ``reshape``
(``reshaped_input``), a step's inputs gaining or losing a batch dimension of 1
(``step_inputs``, core ``InitStep``), the client's regions of a step's outputs
(``output_regions``), and an ensemble response's outputs in core's order
(``ensemble_outputs``, ``CheckAndSetEnsembleOutput``). Pure.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import msgspec

from triton_mp.common.unordered import iteration_order
from triton_mp.ipc.protocol.messages import BlockRef, Handoff, InferRequest, OutputRegion, TensorRef
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.scheduler.policies.ensemble import Call
from triton_mp.scheduler.rules.step_inputs import apply_reshape, reshape_dims


@dataclass(frozen=True, slots=True)
class Value:
    """One ensemble tensor (the policy's opaque value): where it lies, and the batch size of
    the request that made it, 0 when that model (or the ensemble) does not batch (core
    ``TensorData::batch_size_``)."""

    ref: TensorRef
    batch: int


@dataclass(frozen=True, eq=False)
class Blocks:
    """The blocks of a nested ensemble's response (its steps' blocks), one opaque block of
    the outer ensemble's policy."""

    refs: tuple[BlockRef, ...]


def refs_of(block: object) -> tuple[BlockRef, ...]:
    """The arena blocks behind one of the policy's opaque blocks."""
    return block.refs if isinstance(block, Blocks) else (cast(BlockRef, block),)


def flat(blocks: tuple[object, ...]) -> tuple[BlockRef, ...]:
    """The arena blocks behind the policy's opaque blocks, in order."""
    return tuple(ref for block in blocks for ref in refs_of(block))


@functools.lru_cache(maxsize=256)
def output_order(names: tuple[str, ...]) -> tuple[str, ...]:
    """An ensemble's outputs in its ``unordered_map``'s order (once per set of names)."""
    return tuple(iteration_order(names))


def handoffs_of(pairs: tuple[tuple[object, int], ...]) -> tuple[Handoff, ...]:
    """The policy's (block, uses) handoffs as messages."""
    return tuple(Handoff(ref, uses) for block, uses in pairs for ref in refs_of(block))


def reshaped_input(spec: ModelVersionSpec, ref: TensorRef) -> TensorRef:
    """An ensemble input as its steps get it: with the ensemble's config ``reshape``
    applied (core hands them the normalized shape, batch dimension kept)."""
    config = next((t for t in spec.inputs if t.name == ref.name), None)
    if config is None or config.reshape is None:
        return ref
    batched = spec.max_batch_size > 0
    head, item = (ref.shape[:1], ref.shape[1:]) if batched else ((), ref.shape)
    shape = head + apply_reshape(config.dims, config.reshape, item)
    return msgspec.structs.replace(ref, shape=shape)


def step_inputs(spec: ModelVersionSpec, call: Call) -> tuple[TensorRef, ...]:
    """A step's inputs as core ``InitStep`` sets them: a placeholder (an output not
    produced) is no input; each tensor gains or loses a batch dimension of 1 between a
    model that batches and one that does not (``reshape_dims``)."""
    dims = {t.name: t.dims for t in spec.inputs}
    batched = spec.max_batch_size > 0
    inputs = []
    for name, value in call.inputs:
        if value is None:
            continue
        ref = cast(Value, value).ref
        shape = reshape_dims(dims.get(name, ()), batched, value.batch, ref.shape)
        inputs.append(msgspec.structs.replace(ref, name=name, shape=shape))
    return tuple(inputs)


def output_regions(
    req: InferRequest, output_map: dict[str, str], outputs: tuple[str, ...]
) -> tuple[OutputRegion | None, ...]:
    """The client's shared-memory region of each step output that is a requested
    ensemble output (the worker writes it there once)."""
    if not req.output_regions:
        return ()
    wanted = dict(zip(req.outputs, req.output_regions, strict=True))
    return tuple(wanted.get(output_map.get(name, "")) for name in outputs)


def ensemble_outputs(
    spec: ModelVersionSpec, requested: tuple[str, ...], values: dict[str, object]
) -> tuple[TensorRef, ...]:
    """An ensemble response's outputs as core ``CheckAndSetEnsembleOutput`` adds them:
    the requested ones (all when none was named) in the order of its ``unordered_map``
    of the config's outputs, whatever order the request named them in; one no step
    produced is left out ("Composing models did not output tensor"); each gains or loses
    a batch dimension of 1 against the output's ``reshape`` (else ``dims``)."""
    shapes = {t.name: t.dims if t.reshape is None else t.reshape for t in spec.outputs}
    wanted = set(requested or values)
    batched = spec.max_batch_size > 0
    out = []
    for name in output_order(tuple(shapes)):
        value = cast(Value | None, values.get(name))
        if value is None or name not in wanted:
            continue
        shape = reshape_dims(shapes[name], batched, value.batch, value.ref.shape)
        out.append(msgspec.structs.replace(value.ref, name=name, shape=shape))
    return tuple(out)
