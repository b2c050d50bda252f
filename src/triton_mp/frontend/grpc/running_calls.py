"""The calls the Python gRPC server is running, for its stop (``server_setup.stop_grpc``).

grpc's shutdown waits for every connection, even one with no call, up to 20 s for a client
that answers nothing (a stopped process: grpc's graceful GOAWAY waits that long for its ping's
answer). With no call running there is nothing left to hand over, so the stop closes such
connections at once (the native server's twin is ``frontend/native/stop_cut.h``); only a call
still running at the end of the budget is a cut.

grpc.aio has no count of its calls. Each call it serves runs one asyncio task from the call's
start until grpc core says the call is closed (all of its answer sent and its status with it,
or the call cancelled): the task of grpc's ``_schedule_rpc_coro``, which outlives the task
that runs the handler (that one ends once the answer is handed to core, with its bytes maybe
still unsent to a client that does not read). Those tasks are counted, by the coroutine's
name: grpc's own, held by tests/unit/test_stop_exit_status.py for the grpcio installed.
"""

from __future__ import annotations

import asyncio

CALL_TASK = "_schedule_rpc_coro"
"""The ``__name__`` of the coroutine of the task grpc.aio runs for each call it serves, from
the call's start to its close in grpc core (grpcio's ``server.pyx.pxi``)."""
POLL_S = 0.02
"""How often ``idle`` looks again while calls run."""


def running_calls() -> int:
    """The calls the grpc.aio servers of this event loop are serving now (started, not
    closed)."""
    return sum(1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == CALL_TASK)


async def idle() -> None:
    """Return once no call runs (at once when none does)."""
    while running_calls():
        await asyncio.sleep(POLL_S)
