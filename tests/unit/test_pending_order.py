"""``frontend.dispatch.pending.PendingTable``: preserve_ordering holds responses until every earlier
request of the same model has been answered; errors go at once; a decoupled request's sink
gets every response; the drain's idle event. No shared memory: the requests own no blocks."""

from __future__ import annotations

import asyncio

from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.ipc import SegmentCache
from triton_mp.ipc.protocol.messages import ErrorInfo, InferResponse, RequestFailed


def _ok(rid: int) -> InferResponse:
    return InferResponse(request_id=rid, version=1)


def _failed(rid: int) -> RequestFailed:
    return RequestFailed(request_id=rid, error=ErrorInfo(ErrorCode.UNAVAILABLE, "timeout"))


def _run(order: object, answers: list[list[InferResponse | RequestFailed]]) -> list[int]:
    """Register 4 requests, deliver ``answers`` in rounds; the request ids resolved after
    each round, in resolution order (a request id is 1..4)."""

    async def main() -> list[int]:
        table = PendingTable(SegmentCache())
        resolved: list[int] = []
        for _ in range(4):
            table.add_request(
                table.new_id(), None, lambda m: resolved.append(m.request_id), order=order
            )
        for batch in answers:
            table.deliver(batch)
            resolved.append(0)
        assert len(table) == 0
        return resolved

    return asyncio.run(main())


def test_without_order_responses_go_as_they_come() -> None:
    assert _run(None, [[_ok(3)], [_ok(1), _ok(4)], [_ok(2)]]) == [3, 0, 1, 4, 0, 2, 0]


def test_with_order_a_later_response_waits_for_the_earlier_ones() -> None:
    got = _run(("m", 1), [[_ok(3)], [_ok(1), _ok(4)], [_ok(2)]])
    assert got == [0, 1, 0, 2, 3, 4, 0]


def test_with_order_errors_go_at_once_and_unblock_the_stream() -> None:
    got = _run(("m", 1), [[_ok(2), _ok(4)], [_failed(3)], [_failed(1)]])
    assert got == [0, 3, 0, 1, 2, 4, 0]


def test_streams_are_per_model() -> None:
    async def main() -> list[int]:
        table = PendingTable(SegmentCache())
        resolved: list[int] = []
        for order in (("a", 1), ("b", 1), ("a", 1)):
            table.add_request(
                table.new_id(), None, lambda m: resolved.append(m.request_id), order=order
            )
        table.deliver([_ok(2), _ok(3)])
        table.deliver([_ok(1)])
        return resolved

    assert asyncio.run(main()) == [2, 1, 3]


def test_a_request_forgotten_before_sending_leaves_its_stream() -> None:
    async def main() -> list[int]:
        table = PendingTable(SegmentCache())
        resolved: list[int] = []
        first, second = table.new_id(), table.new_id()
        table.add_request(first, None, lambda m: resolved.append(m.request_id), order="s")
        table.add_request(second, None, lambda m: resolved.append(m.request_id), order="s")
        table.forget_request(first)
        table.deliver([_ok(second)])
        return resolved

    assert asyncio.run(main()) == [2]


def test_decoupled_request_gets_every_response_and_ends_at_the_final_one() -> None:
    async def main() -> None:
        table = PendingTable(SegmentCache())
        got: list[object] = []
        rid = table.new_id()
        table.add_request(rid, None, got.append, streaming=True)
        assert len(table) == 1
        table.deliver([InferResponse(request_id=rid, version=1, final=False)])
        table.deliver([InferResponse(request_id=rid, version=1, final=False)])
        assert len(table) == 1
        table.deliver([InferResponse(request_id=rid, version=1, final=True, empty=True)])
        assert len(table) == 0
        # a response after the end (a dropped stream's late answer) reaches nobody
        table.deliver([InferResponse(request_id=rid, version=1)])
        assert [m.final for m in got] == [False, False, True]  # type: ignore[attr-defined]
        rid2 = table.new_id()
        table.add_request(rid2, None, got.append, streaming=True)
        table.deliver([_failed(rid2)])
        assert len(table) == 0
        assert isinstance(got[-1], RequestFailed)

    asyncio.run(main())


def test_a_failing_stream_callback_does_not_stop_delivery() -> None:
    async def main() -> None:
        table = PendingTable(SegmentCache())

        def boom(msg: object) -> None:
            raise RuntimeError("bug")

        rid, other = table.new_id(), table.new_id()
        table.add_request(rid, None, boom, streaming=True)
        got: list[object] = []
        table.add_request(other, None, got.append)
        table.deliver([InferResponse(request_id=rid, version=1), _ok(other)])
        assert got == [_ok(other)]
        assert len(table) == 0

    asyncio.run(main())


def test_wait_idle_returns_once_the_last_request_is_answered() -> None:
    async def main() -> None:
        table = PendingTable(SegmentCache())
        await asyncio.wait_for(table.wait_idle(), 1)  # nothing pending: at once
        a, b = table.new_id(), table.new_id()
        table.add_request(a, None, lambda m: None)
        table.add_request(b, None, lambda m: None, streaming=True)
        waiter = asyncio.ensure_future(table.wait_idle())
        table.deliver([_ok(a)])
        await asyncio.sleep(0)
        assert not waiter.done()
        table.deliver([InferResponse(request_id=b, version=1, final=True)])
        await asyncio.wait_for(waiter, 1)

    asyncio.run(main())
