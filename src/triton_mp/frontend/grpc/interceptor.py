"""Restricted protocols on the gRPC side: a server interceptor (frontend process only).

Installed only when ``--grpc-restricted-protocol`` restricts something, so an open server
pays nothing per call. The categories, the flag syntax, the method table and the messages
are in ``triton_mp.frontend.restricted``; HTTP applies the same rules per route in
``frontend.http.routes``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from triton_mp.frontend.restricted import Restrictions, grpc_rules


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers UNAVAILABLE ``message``."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuse calls to restricted categories that lack ``triton-grpc-protocol-<key>: <value>``.

    Args:
        restrictions: category -> (header key, expected value), from the flag.
    """

    def __init__(self, restrictions: Restrictions) -> None:
        self._rules = grpc_rules(restrictions)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass the call on, or swap its handler for one that refuses it."""
        handler = await continuation(handler_call_details)
        rule = self._rules.get(handler_call_details.method)
        if rule is None or handler is None:
            return handler
        header, value, message = rule
        for k, v in handler_call_details.invocation_metadata or ():
            if k == header and v == value:
                return handler
        return _refusing(handler, message)
