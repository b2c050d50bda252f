"""The HTTP server's stop: answers still being written get the rest of the exit budget.

Imported by ``frontend.http.routes`` (``HttpFrontend.stop``). The frontend stops HTTP once its
in-flight inferences were answered (``frontend.main._drain``), but an answer can still be on
its way to a client that reads slowly (a large answer, a full socket buffer): 2.51 waits for
it until ``--exit-timeout-secs`` ends, then logs "Exit timeout expired" and exits 1. Here the
listening socket closes first, each connection's unsent bytes (aiohttp's transport buffer)
get until the budget's end, and what is still unsent then is cut with its connection; the stop
says so, as the gRPC stops do (``frontend.native.stop_cut.h``, ``frontend.grpc.server_setup
.stop_grpc``), and the server exits 1.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

WRITE_POLL_S = 0.02
"""How often the stop looks at the connections' unsent bytes while it waits (seconds)."""


def _writing(runner: web.AppRunner) -> list[asyncio.WriteTransport]:
    """The connections of ``runner`` that hold bytes of an answer not yet handed to the
    kernel (their clients do not read fast enough)."""
    server = runner.server
    if server is None:
        return []
    return [
        t
        for t in (conn.transport for conn in server.connections)
        if isinstance(t, asyncio.WriteTransport) and t.get_write_buffer_size() > 0
    ]


async def stop_runner(runner: web.AppRunner, grace_s: float) -> bool:
    """Stop listening, wait up to ``grace_s`` seconds for the answers still being written,
    then close every connection (``runner.cleanup``). Returns whether an answer was still
    being written then (and was cut)."""
    for site in list(runner.sites):
        await site.stop()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    writing = _writing(runner)
    while writing and loop.time() < deadline:
        await asyncio.sleep(WRITE_POLL_S)
        writing = _writing(runner)
    for transport in writing:
        # NOTE: cut now: its handler (waiting to write) ends at once, not after the
        # runner's shutdown_timeout
        transport.abort()
    await runner.cleanup()
    return bool(writing)
