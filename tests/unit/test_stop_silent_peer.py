"""The stop's decision about connections with no call: closed at once, not waited for.

grpc's shutdown waits for every connection, up to 20 s for a peer that answers nothing (its
graceful GOAWAY waits that long for its ping's answer). With no call running there is nothing
to hand over, so both gRPC servers close such connections once no call runs: the Python one
(``stop_grpc``, counting calls with ``running_calls``) and the native one (``stop_cut.h``).
The silent peer here opened an HTTP/2 connection (preface and SETTINGS) and then reads and
answers nothing, as a stopped client (tests/e2e/test_s19_stop_stopped_client.py: a real
client, SIGSTOPped, side by side with 2.51). A call still running at the end of the grace is
still cut and said so.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from tests.helpers.echo_server import METHOD, echo_server
from triton_mp.frontend import native
from triton_mp.frontend.grpc.running_calls import running_calls
from triton_mp.frontend.grpc.server_setup import stop_grpc

GRACE_S = 6.0
"""The budget: far more than a stop with nothing to hand over may take."""
QUICK_S = 2.0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""HTTP/2's client preface, then an empty SETTINGS frame: a connection grpc serves."""


@contextmanager
def _silent_peer(port: int) -> Iterator[socket.socket]:
    """A connection to ``port`` that says hello (``PREFACE``) and then nothing more, closed
    when the block ends."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(PREFACE)
        yield s


async def _python_stop_with_silent_peer() -> tuple[bool, float]:
    server = echo_server(0.0, asyncio.Event())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with _silent_peer(port):
        await asyncio.sleep(0.3)  # NOTE: the server has taken the connection
        t0 = time.monotonic()
        cut = await stop_grpc(server, GRACE_S)
        return cut, time.monotonic() - t0


def test_python_server_does_not_wait_for_a_silent_connection() -> None:
    cut, took = asyncio.run(_python_stop_with_silent_peer())
    assert not cut
    assert took < QUICK_S


async def _count_during_a_call() -> tuple[int, int, int]:
    started = asyncio.Event()
    server = echo_server(0.3, started)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    before = running_calls()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = asyncio.ensure_future(channel.unary_unary(METHOD)(b"x"))
        await asyncio.wait_for(started.wait(), 10)
        during = running_calls()
        assert await call == b"x"
    deadline = time.monotonic() + 5
    while running_calls() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    after = running_calls()
    await server.stop(None)
    return before, during, after


def test_running_calls_counts_the_call_grpc_serves() -> None:
    """Pins grpc.aio's task name (``running_calls.CALL_TASK``) for the grpcio installed."""
    assert asyncio.run(_count_during_a_call()) == (0, 1, 0)


needs_native = pytest.mark.skipif(not native.available(), reason="native extension not built")


async def _native_stop(handler_s: float, grace_s: float, silent: bool) -> tuple[bool, float]:
    """The native server (no handoff: every call relayed to a grpc.aio server on a unix
    socket), stopped ``grace_s`` with a silent peer connected, or while a call whose handler
    takes ``handler_s`` runs. Returns what the stop said and how long it took."""
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    backend = echo_server(handler_s, started)
    with tempfile.TemporaryDirectory() as d:
        assert backend.add_insecure_port(f"unix:{d}/py.sock")
        await backend.start()
        server = native.NativeServer("127.0.0.1:0", f"unix:{d}/py.sock", [], handoff=False)
        port = server.start()
        assert port
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = asyncio.ensure_future(channel.unary_unary(METHOD)(b"x"))
                await asyncio.wait_for(started.wait(), 10)
                if silent:
                    assert await call == b"x"
                with _silent_peer(port):
                    await asyncio.sleep(0.3)
                    t0 = time.monotonic()
                    cut = await loop.run_in_executor(None, server.stop, grace_s)
                    took = time.monotonic() - t0
                if not silent:
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await call
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            server.stop(0)
            await backend.stop(None)
    return cut, took


@needs_native
def test_native_server_does_not_wait_for_a_silent_connection() -> None:
    cut, took = asyncio.run(_native_stop(0.0, GRACE_S, silent=True))
    assert not cut
    assert took < QUICK_S


@needs_native
def test_native_server_cuts_a_call_running_past_the_grace() -> None:
    cut, took = asyncio.run(_native_stop(30.0, 1.0, silent=False))
    assert cut
    assert 0.9 < took < 1.0 + QUICK_S
