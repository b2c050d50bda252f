"""A grpc.aio server with one unary method, for the tests of the gRPC stop (``stop_grpc``,
``running_calls``) that need a server with a call in it and nothing of triton-mp's."""

from __future__ import annotations

import asyncio

import grpc

METHOD = "/t.S/Echo"
"""The one method's full name: it answers its request bytes."""


def echo_server(handler_s: float, started: asyncio.Event) -> grpc.aio.Server:
    """A grpc.aio server (not started, no port) whose ``METHOD`` answers its request after
    ``handler_s`` seconds; ``started`` is set when a call begins."""

    async def echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        started.set()
        await asyncio.sleep(handler_s)
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "t.S", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
            )
        ]
    )
    return server
