"""Blocks several ensemble responses share: the policy's handoffs and the requester's counts.

``fork``: step ``split`` writes the ensemble output ``a`` and ``mid`` into one block; the
decoupled step ``rep`` reads ``mid`` and answers several times (``b``). Every ensemble
response names ``a``'s block, so it is freed once, by the requester, after the last of them.
"""

from __future__ import annotations

import random

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    ErrorInfo,
    Handoff,
    InferResponse,
    RequestFailed,
)
from triton_mp.ipc.tensor_pool import SharedBlocks
from triton_mp.scheduler.policies.ensemble import (
    Call,
    Complete,
    EnsembleScheduler,
    Fail,
    Release,
    Step,
)

FORK = [
    Step("split", -1, (("IN", "in"),), (("OUTA", "a"), ("MID", "mid"))),
    Step("rep", -1, (("IN", "mid"),), (("OUT", "b"),), decoupled=True),
]
A = BlockRef("split-arena", 64)


def _b(k: int) -> BlockRef:
    return BlockRef("rep-arena", 64 * k)


def _started() -> tuple[EnsembleScheduler, Call]:
    ens = EnsembleScheduler("fork", FORK, ["a", "b"], decoupled=True)
    (split,) = [a for a in ens.start("r", {"in": "i"}) if isinstance(a, Call)]
    acts = ens.respond(split.call_id, {"OUTA": "a-ref", "MID": "mid-ref"}, A, final=True)
    (rep,) = [a for a in acts if isinstance(a, Call)]
    return ens, rep


def test_sibling_responses_share_the_upstream_block_and_the_final_hands_it_over() -> None:
    ens, rep = _started()
    acts: list = []
    for k in (1, 2, 3):
        acts += ens.respond(rep.call_id, {"OUT": f"b{k}"}, _b(k), final=False)
    acts += ens.respond(rep.call_id, None, None, final=True)
    completes = [a for a in acts if isinstance(a, Complete)]
    assert [c.outputs for c in completes[:3]] == [{"a": "a-ref", "b": f"b{k}"} for k in (1, 2, 3)]
    for k, c in enumerate(completes[:3], start=1):
        assert c.blocks == (_b(k),)  # its own block goes with it
        assert c.shared == (A,)
    assert Release(A) not in acts  # the scheduler never frees what responses still name
    assert [h for c in completes for h in c.handoffs] == [(A, 3)]
    assert completes[-1].final
    assert ens.live_blocks() == 0


def test_the_last_response_hands_the_block_over_when_it_is_also_the_final() -> None:
    ens, rep = _started()
    ens.respond(rep.call_id, {"OUT": "b1"}, _b(1), final=False)
    acts = ens.respond(rep.call_id, {"OUT": "b2"}, _b(2), final=True)
    (last,) = [a for a in acts if isinstance(a, Complete)]
    assert last.final
    assert last.shared == (A,)
    assert last.handoffs == ((A, 2),)
    assert ens.live_blocks() == 0


def test_a_failure_after_sent_responses_hands_their_shared_block_over() -> None:
    ens, rep = _started()
    sent = ens.respond(rep.call_id, {"OUT": "b1"}, _b(1), final=False)
    sent += ens.respond(rep.call_id, {"OUT": "b2"}, _b(2), final=False)
    acts = ens.respond(rep.call_id, None, None, True, (ErrorCode.INTERNAL, "boom"))
    assert len([a for a in sent if isinstance(a, Complete)]) == 2
    (fail,) = [a for a in acts if isinstance(a, Fail)]
    assert fail.message == "in ensemble 'fork', boom"
    assert fail.handoffs == ((A, 2),)
    assert Release(A) not in acts
    assert ens.live_blocks() == 0


def test_an_output_no_other_response_names_travels_alone_as_before() -> None:
    steps = [Step("m", -1, (("IN", "in"),), (("OUT", "out"),))]
    ens = EnsembleScheduler("one", steps, ["out"])
    (call,) = [a for a in ens.start("r", {"in": "i"}) if isinstance(a, Call)]
    (done,) = ens.respond(call.call_id, {"OUT": "o"}, A, final=True)
    assert done == Complete("r", {"out": "o"}, (A,), True)


def _response(rid: int, shared: tuple = (), handoffs: tuple = (), block=None) -> InferResponse:
    return InferResponse(
        request_id=rid, version=1, block=block, shared_blocks=shared, handoffs=handoffs
    )


def test_the_requester_frees_a_shared_block_after_its_last_release_and_its_handoff() -> None:
    shares = SharedBlocks()
    r1, r2 = _response(1, (A,), block=_b(1)), _response(2, (A,), block=_b(2))
    final = _response(3, handoffs=(Handoff(A, 2),))
    assert shares.arrived(r1) == []
    assert shares.arrived(r2) == []
    assert shares.released(r2) == [_b(2)]  # released out of order
    assert shares.arrived(final) == []  # r1 still holds A
    assert shares.released(final) == []
    assert shares.released(r1) == [_b(1), A]
    assert shares.pending() == 0
    # every release before the handoff: the handoff frees at once
    assert shares.released(r1) == [_b(1)]
    assert shares.arrived(
        RequestFailed(
            request_id=1,
            error=ErrorInfo(code=ErrorCode.INTERNAL, message="x"),
            handoffs=(Handoff(A, 1),),
        )
    ) == [A]
    assert shares.pending() == 0


def test_policy_and_requester_together_free_every_block_once_after_its_last_reader() -> None:
    """Random response counts, failures and release orders: each block is freed exactly
    once (by the scheduler's ``Release`` or the requester), never while a response that
    names it is unreleased."""
    rng = random.Random(16)
    for trial in range(300):
        ens, rep = _started()
        shares, freed, held = SharedBlocks(), [], []
        answers: list = []
        n = rng.randint(0, 5)
        fail_at = rng.choice([None, rng.randint(1, n + 1)])
        sent = 0
        for k in range(1, n + 1):
            if k == fail_at:
                break
            answers += ens.respond(rep.call_id, {"OUT": f"b{k}"}, _b(k), final=False)
            sent = k
        error = (ErrorCode.INTERNAL, "boom") if fail_at is not None else None
        answers += ens.respond(rep.call_id, None, None, True, error)
        for action in answers:
            if isinstance(action, Release):
                assert all(action.block not in h.shared_blocks for h in held), trial
                freed.append(action.block)
            elif isinstance(action, Complete | Fail):
                handoffs = tuple(Handoff(b, u) for b, u in action.handoffs)
                if isinstance(action, Fail):
                    msg = RequestFailed(
                        request_id=1,
                        error=ErrorInfo(code=action.code, message=action.message),
                        handoffs=handoffs,
                    )
                    freed += shares.arrived(msg)
                    continue
                blocks = tuple(action.blocks)
                msg = InferResponse(
                    request_id=1,
                    version=1,
                    block=blocks[0] if blocks else None,
                    extra_blocks=blocks[1:],
                    shared_blocks=tuple(action.shared),
                    handoffs=handoffs,
                    empty=not action.outputs,
                )
                freed += shares.arrived(msg)
                held.append(msg)
            # a random number of held responses is released after each answer
            rng.shuffle(held)
            for _ in range(rng.randint(0, len(held))):
                msg = held.pop()
                newly = shares.released(msg)
                for block in newly:
                    assert all(block not in (*h.shared_blocks, h.block) for h in held), trial
                freed += newly
        for msg in held:
            freed += shares.released(msg)
        expected = {A, *(_b(k) for k in range(1, sent + 1))}
        assert sorted(freed, key=lambda b: (b.segment, b.offset)) == sorted(
            expected, key=lambda b: (b.segment, b.offset)
        ), trial
        assert shares.pending() == 0
        assert ens.live_blocks() == 0
