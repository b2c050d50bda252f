"""The stop's exit status, as 2.51's: when the exit budget runs out with gRPC calls still
running (answers not produced, or produced and not sent to a client that does not read),
tritonserver logs "Exit timeout expired" and exits 1. A frontend whose stop had to cancel
calls exits ``CALLS_CUT_EXIT`` and the supervisor's stop counts it as the budget expiring
(``ChildTable.stop_frontends``); the Python gRPC server's stop says whether it cancelled
calls (``stop_grpc``; the native server's is ``stop_cut.h``, held end to end by
tests/e2e/test_r19_stop_unread.py)."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest

from tests.helpers.echo_server import METHOD, echo_server
from tests.unit.test_child_hand_over import _Process
from triton_mp.frontend.grpc.server_setup import stop_grpc
from triton_mp.ipc.handshake import CALLS_CUT_EXIT
from triton_mp.supervisor.processes.children import Child, ChildTable


class _Exited(_Process):
    """A frontend that exited with ``code`` (None: reaped by another thread, code unknown)."""

    def __init__(self, pid: int, code: int | None) -> None:
        super().__init__(pid, alive=False)
        self.exitcode = code

    def terminate(self) -> None:
        raise AssertionError("an exited frontend is not signalled")


@pytest.mark.parametrize(
    ("code", "expired"), [(CALLS_CUT_EXIT, True), (0, False), (None, False), (1, False)]
)
def test_a_frontend_that_cut_calls_makes_the_stop_an_expired_one(
    code: int | None, expired: bool
) -> None:
    table = ChildTable()
    clean, other = Child("frontend", "0", b""), Child("frontend", "1", b"")
    clean.process, other.process = _Exited(41, 0), _Exited(42, code)  # type: ignore[assignment]
    table.add([clean, other])
    assert table.stop_frontends(drain=True, deadline=time.monotonic()) is expired


@pytest.mark.parametrize(
    ("code", "crashed"),
    [
        (-signal.SIGSEGV, True),
        (-signal.SIGABRT, True),
        (-signal.SIGTERM, False),  # the drain's own signal, before its handler was in
        (-signal.SIGKILL, False),  # the stop's kill at the deadline (counted as expired)
        (0, False),
        (CALLS_CUT_EXIT, False),
        (None, False),
    ],
)
def test_a_frontend_a_signal_ended_while_it_drained_is_a_crash(
    code: int | None, crashed: bool
) -> None:
    """A frontend that died by a signal the stop did not send lost the calls it held: the
    supervisor logs it and exits 1 (``Supervisor._stop_all``), without tritonserver's "Exit
    timeout expired" (the budget did not run out)."""
    table = ChildTable()
    clean, other = Child("frontend", "0", b""), Child("frontend", "1", b"")
    clean.process, other.process = _Exited(41, 0), _Exited(42, code)  # type: ignore[assignment]
    table.add([clean, other])
    assert table.crashed_frontends() == ([42] if crashed else [])


HOLD_S = 30.0
"""How long the slow handler would take: far past any grace here."""


async def _serve_one_call(handler_s: float, grace_s: float) -> tuple[bool, float, object]:
    """One unary call whose handler takes ``handler_s``; once it runs, ``stop_grpc`` with
    ``grace_s``. Returns what it said, how long it took, and the call's outcome (its answer
    or its status code)."""
    started = asyncio.Event()
    server = echo_server(handler_s, started)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = asyncio.ensure_future(channel.unary_unary(METHOD)(b"x"))
        await asyncio.wait_for(started.wait(), 10)
        t0 = time.monotonic()
        cut = await stop_grpc(server, grace_s)
        took = time.monotonic() - t0
        try:
            outcome: object = await call
        except grpc.aio.AioRpcError as e:
            outcome = e.code()
    return cut, took, outcome


def test_a_call_running_past_the_grace_is_cut_and_said_so() -> None:
    cut, took, outcome = asyncio.run(_serve_one_call(HOLD_S, 0.5))
    assert cut
    assert 0.4 < took < 5.0  # NOTE: at the grace, not after the handler
    assert outcome == grpc.StatusCode.UNAVAILABLE


def test_a_call_answered_within_the_grace_is_not_cut() -> None:
    cut, took, outcome = asyncio.run(_serve_one_call(0.2, 5.0))
    assert not cut
    assert took < 4.0
    assert outcome == b"x"
