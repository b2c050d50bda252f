"""What the ensemble scheduler (``policies.ensemble``) is told and tells its caller.

Imported by ``policies.ensemble`` (which re-exports these) and, through it,
``scheduler.ensembles`` and ``scheduler.registry``. ``Step`` is one configured step; the
actions (``Call``, ``Release``, ``Complete``, ``Fail``) are what the caller turns into
messages (``scheduler.ensembles``). Values and blocks are the caller's, opaque here. Pure.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from triton_mp.common.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Step:
    """One ``ensemble_scheduling.step``.

    Attributes:
        model: ``model_name``; ``version``: ``model_version`` (-1: latest, resolved per call).
        inputs: ``input_map`` as (composing input, ensemble tensor) pairs.
        outputs: ``output_map`` as (composing output, ensemble tensor) pairs.
        decoupled: the composing model is decoupled (each response forks the context).
    """

    model: str
    version: int
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """Send a composing request: ``inputs`` as (composing input name, value)."""

    call_id: int
    request: Hashable
    step: int
    inputs: tuple[tuple[str, Any], ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """Free this block (no consumer is left)."""

    block: Hashable


@dataclass(frozen=True, slots=True)
class Complete:
    """One response of an ensemble request: ensemble output name -> value.

    Attributes:
        blocks: blocks holding its outputs that now belong to it alone (the requester frees
            them when it releases this response).
        shared: blocks holding its outputs that other holders share (a decoupled step's
            sibling responses, steps still to run); releasing this response is one use.
        handoffs: (shared block, uses in all): blocks the requester now owns, to free once
            it has released that many responses naming them in ``shared``.
    """

    request: Hashable
    outputs: dict[str, Any]
    blocks: tuple[Hashable, ...]
    final: bool
    shared: tuple[Hashable, ...] = ()
    handoffs: tuple[tuple[Hashable, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Fail:
    """The ensemble request failed (message already prefixed); ``handoffs`` as in
    ``Complete`` (shared blocks of responses it sent before)."""

    request: Hashable
    code: ErrorCode
    message: str
    handoffs: tuple[tuple[Hashable, int], ...] = ()


Action = Call | Release | Complete | Fail
