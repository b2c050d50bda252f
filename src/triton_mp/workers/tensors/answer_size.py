"""An answer too large for its ring record, made small enough to reach the client.

A worker's ``InferResponse`` travels as one ring record, which must fit half the answer
ring (``ServerConfig.answer_ring_bytes``, 64 KiB: 32 KiB). Outputs live in shared-memory
blocks, so only text can make a record too large: a python model's error message (a
``TritonError`` or an exception's text) or its response ``parameters``. Triton sends either
whole (over gRPC a very long message fails the call with RESOURCE_EXHAUSTED); triton-mp
answers with the error's first ``ERROR_BYTES`` bytes (the gRPC frontend then cuts its
status to 4 KiB, ``frontend.grpc.servicer.status_message``), or, for parameters, an INTERNAL
error that says so. Either way the client gets an answer and the worker goes on.
"""

from __future__ import annotations

import msgspec

from triton_mp.common.errors import ErrorCode, cut_utf8
from triton_mp.ipc.protocol.messages import ErrorInfo, InferResponse

ERROR_BYTES = 16384
"""UTF-8 bytes of an over-long error message kept (the rest is counted, not sent)."""


def fit_answer(msg: InferResponse, origin: str, error_bytes: int = ERROR_BYTES) -> InferResponse:
    """A record-sized stand-in for ``msg`` (its request, version and final flag kept).

    An error keeps its code and its first ``error_bytes`` bytes of message; a success
    whose parameters do not fit becomes an INTERNAL error without outputs (the caller
    frees its block) and without parameters; a trace record, if any, is dropped.
    """
    if msg.error is not None:
        error = ErrorInfo(
            msg.error.code, cut_utf8(msg.error.message, error_bytes), msg.error.origin
        )
        return msgspec.structs.replace(msg, error=error, parameters_json="", trace=None)
    why = (
        f"response parameters of {len(msg.parameters_json)} bytes are too large to send "
        "(a triton-mp response carries at most a few KiB of parameters)"
        if msg.parameters_json
        else "response record too large to send"
    )
    return InferResponse(
        request_id=msg.request_id,
        version=msg.version,
        error=ErrorInfo(ErrorCode.INTERNAL, why, origin),
        final=msg.final,
    )
