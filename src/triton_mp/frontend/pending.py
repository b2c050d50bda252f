"""Requests and queries a frontend is waiting on, and delivery of their answers.

Imported by the frontend only. The event loop drains the inbox when its FIFO wakes it and
calls ``deliver`` with everything drained, on the loop thread. The frontend frees its own
input block when a request's answer arrives (by then the worker has stopped reading it), and
frees a worker's output block at once when nobody waits for it any more (the client went away).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

from triton_mp.ipc import BlockRef, SegmentCache, free_block
from triton_mp.ipc.messages import InferResponse, QueueReply, RequestFailed, StatsReply


class PendingTable:
    """request id -> (future, input block); query id -> future."""

    def __init__(self, cache: SegmentCache) -> None:
        self._cache = cache
        self._requests: dict[
            int, tuple[asyncio.Future[InferResponse | RequestFailed], BlockRef]
        ] = {}
        self._queries: dict[int, asyncio.Future[StatsReply | QueueReply]] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._requests)

    def new_request(
        self, block: BlockRef
    ) -> tuple[int, asyncio.Future[InferResponse | RequestFailed]]:
        """Register a request whose inputs are in ``block``; returns (request id, future)."""
        rid = next(self._ids)
        fut: asyncio.Future[InferResponse | RequestFailed] = (
            asyncio.get_running_loop().create_future()
        )
        self._requests[rid] = (fut, block)
        return rid, fut

    def forget_request(self, request_id: int) -> None:
        """Drop a request that was never sent, freeing its input block."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self.free(entry[1])

    def new_query(self) -> tuple[int, asyncio.Future[StatsReply | QueueReply]]:
        """Register a query to the scheduler (statistics, queues); returns (query id, future)."""
        qid = next(self._ids)
        fut: asyncio.Future[StatsReply | QueueReply] = asyncio.get_running_loop().create_future()
        self._queries[qid] = fut
        return qid, fut

    def free(self, block: BlockRef | None) -> None:
        """Mark a block FREE in its arena (inputs: ours; outputs: a worker's)."""
        if block is not None:
            free_block(self._cache.get(block.segment).buf, block.offset)

    def deliver(
        self, msgs: Iterable[InferResponse | RequestFailed | StatsReply | QueueReply]
    ) -> None:
        """Resolve the futures of every answer in ``msgs`` (loop thread only)."""
        for msg in msgs:
            if isinstance(msg, StatsReply | QueueReply):
                qfut = self._queries.pop(msg.query_id, None)
                if qfut is not None and not qfut.done():
                    qfut.set_result(msg)
                continue
            entry = self._requests.pop(msg.request_id, None)
            out_block = msg.block if isinstance(msg, InferResponse) else None
            if entry is None:
                # NOTE: an answer for a request already failed (e.g. worker restart race).
                self.free(out_block)
                continue
            fut, in_block = entry
            self.free(in_block)
            if fut.done():
                self.free(out_block)
            else:
                fut.set_result(msg)
