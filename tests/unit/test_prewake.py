"""The worker's early wake of a batch's frontends (``workers.prewake``): only after a short
batch, once per frontend, never for BLS or ensemble requesters; at the batch's start after a
very short one, after ``execute`` after a longer one."""

from __future__ import annotations

from dataclasses import dataclass

from triton_mp.ipc.protocol.messages import ReplyTo, Requester
from triton_mp.workers.prewake import PREWAKE_MAX_NS, PREWAKE_START_MAX_NS, EarlyWakes

F, B, E = Requester.FRONTEND, Requester.BLS, Requester.ENSEMBLE


@dataclass(frozen=True)
class _Req:
    """What ``EarlyWakes`` reads of a request."""

    reply_to: ReplyTo


def reqs(*to: tuple[Requester, int]) -> list[_Req]:
    """Requests answering ``(kind, id)`` each, in order."""
    return [_Req(ReplyTo(kind, ident)) for kind, ident in to]


def test_the_first_batch_wakes_nobody_early() -> None:
    woken: list[int] = []
    early = EarlyWakes(woken.append)
    assert early.batch_starts(reqs((F, 0))) == 0
    assert woken == []


def test_after_a_short_batch_each_frontend_is_woken_once() -> None:
    woken: list[int] = []
    early = EarlyWakes(woken.append)
    early.batch_ended(PREWAKE_START_MAX_NS - 1)
    assert early.batch_starts(reqs((F, 1), (B, 1), (F, 0), (F, 1), (E, 0))) == 2
    assert early.batch_executed(reqs((F, 1), (F, 0))) == 0  # woken at the start already
    assert woken == [1, 0]


def test_after_a_long_batch_nobody_is_woken_until_a_short_one() -> None:
    woken: list[int] = []
    early = EarlyWakes(woken.append)
    early.batch_ended(PREWAKE_MAX_NS)
    assert early.batch_starts(reqs((F, 0))) == 0
    early.batch_ended(50_000)
    assert early.batch_starts(reqs((F, 0))) == 1
    assert woken == [0]


def test_after_a_longer_batch_the_frontends_are_woken_after_execute_only() -> None:
    woken: list[int] = []
    early = EarlyWakes(woken.append)
    early.batch_ended(PREWAKE_START_MAX_NS)
    assert early.batch_starts(reqs((F, 0), (F, 2))) == 0
    assert early.batch_executed(reqs((F, 0), (B, 3), (F, 2), (F, 0))) == 2
    assert woken == [0, 2]
    early.batch_ended(PREWAKE_MAX_NS - 1)
    assert early.batch_executed(reqs((F, 1))) == 1
    early.batch_ended(PREWAKE_MAX_NS)
    assert early.batch_starts(reqs((F, 1))) == 0
    assert early.batch_executed(reqs((F, 1))) == 0
    assert woken == [0, 2, 1]


def test_a_batch_answering_one_reply_to_object_wakes_its_frontend_once() -> None:
    # NOTE: the decoder's interned ReplyTo (the common batch) is told by identity; an equal
    # object of another request, another frontend or a BLS requester take the set of ids.
    woken: list[int] = []
    early = EarlyWakes(woken.append)
    early.batch_ended(PREWAKE_START_MAX_NS)
    to, bls = ReplyTo(F, 5), ReplyTo(B, 5)
    assert early.batch_executed([_Req(to)] * 4) == 1
    assert early.batch_executed([_Req(bls)] * 3) == 0
    assert early.batch_executed([]) == 0
    assert early.batch_executed([_Req(to), _Req(to), _Req(ReplyTo(F, 5))]) == 1
    assert early.batch_executed([_Req(to), _Req(bls), _Req(ReplyTo(F, 6)), _Req(to)]) == 2
    assert woken == [5, 5, 5, 6]
