"""The status a handed-off call ends with when its handler fails: the ``(code, details)``
``_native.reply`` takes.

Imported by ``frontend.native.handoff`` and ``frontend.native.known_calls``, which answer
in ``ModelInfer``'s words (``grpc.servicer.grpc_status``) and, for an exception no handler
expected, in grpc.aio's.
"""

from __future__ import annotations

import grpc

from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.grpc.servicer import grpc_status


def code_of(code: grpc.StatusCode) -> int:
    """The numeric gRPC status code of ``code``."""
    return int(code.value[0])


def failed(e: TritonMPError) -> tuple[int, str]:
    """The status ``ModelInfer`` aborts with for ``e`` (``servicer.abort``)."""
    code, details = grpc_status(e.code, e.message)
    return code_of(code), details


def unexpected(e: Exception) -> tuple[int, str]:
    """grpc.aio's answer to a handler's exception: UNKNOWN "Unexpected <type>: <text>"."""
    return code_of(grpc.StatusCode.UNKNOWN), f"Unexpected {type(e)}: {e}"
