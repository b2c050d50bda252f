"""JSON bodies of the HTTP control endpoints, read as Triton's ``http_server.cc`` reads them.

Imported by ``frontend.http.routes``; no aiohttp, so every rule is testable on values. A body
that is JSON but not an object is an object without members here (TritonJson's ``Find`` finds
nothing in it). Covered: RepositoryModelLoad's ``parameters`` (HandleRepositoryControl),
RepositoryModelUnload's ``unload_dependents``, and CUDA shared-memory registration
(HandleCudaSharedMemory), each member in Triton's order, with TritonJson's words (INTERNAL,
HTTP 500) for a member missing or of the wrong type. Base64 is decoded as Triton's libb64
does: characters outside the alphabet are skipped.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.admin.repository import FILE_PREFIX
from triton_mp.frontend.http.json_tensors import (
    access_error,
    decode_json,
    json_string,
    json_uint,
)

_NOT_B64 = re.compile(rb"[^A-Za-z0-9+/]")


def libb64_decode(text: str) -> bytes:
    """``text`` decoded as server ``common.cc`` DecodeBase64 (libb64) decodes it: bytes
    outside the base64 alphabet (padding included) are skipped, a last group of 2 or 3
    characters gives 1 or 2 bytes, a lone last character none."""
    clean = _NOT_B64.sub(b"", text.encode("utf-8", "surrogatepass"))
    if len(clean) % 4 == 1:
        clean = clean[:-1]
    return base64.b64decode(clean + b"=" * (-len(clean) % 4))


def as_object(value: object) -> dict[str, Any]:
    """A decoded body as the object Triton reads members from ({} for any other JSON)."""
    return value if isinstance(value, dict) else {}


def load_parameters(body: dict[str, Any]) -> dict[str, str | bytes]:
    """RepositoryModelLoad's ``parameters``: ``config`` as a string, ``file:<path>`` decoded
    from base64; every member must be a string.

    Raises:
        TritonMPError: INTERNAL "attempt to get members for non-object" (``parameters`` not
            an object), "attempt to access JSON non-string as string" (a member that is not
            a string), "unexpected error on creating Triton parameter" (a member that is
            neither ``config`` nor ``file:``).
    """
    params = body.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise access_error("", "object")
    out: dict[str, str | bytes] = {}
    for key, value in params.items():
        if not isinstance(value, str):
            raise access_error("", "string")
        if key == "config":
            out[key] = value
        elif key.startswith(FILE_PREFIX):
            out[key] = libb64_decode(value)
        else:
            raise TritonMPError("unexpected error on creating Triton parameter", ErrorCode.INTERNAL)
    return out


def unload_dependents(body: dict[str, Any]) -> bool:
    """RepositoryModelUnload's ``parameters.unload_dependents``; False when absent.

    NOTE: Triton parses a value that is not a boolean into an error it then overwrites
    with the unload's own answer, so such a value unloads the model alone; so here.
    """
    params = body.get("parameters")
    if not isinstance(params, dict):
        return False
    value = params.get("unload_dependents", False)
    return value if isinstance(value, bool) else False


def unload_body_dependents(raw: bytes | memoryview) -> bool:
    """``unload_dependents`` of a RepositoryModelUnload body as it came: False also for an
    empty body and for one that is not JSON. Triton's HandleRepositoryControl overwrites the
    parse error with the unload's own answer, so such a body unloads the model alone (2.51:
    200, checked side by side)."""
    if not raw:
        return False
    try:
        body = as_object(decode_json(raw))
    except TritonMPError:
        return False
    return unload_dependents(body)


def cuda_register_body(body: dict[str, Any], handle_bytes: int) -> tuple[bytes, int, int]:
    """A CUDA shared-memory register body: (the IPC handle, byte_size, device_id), read in
    HandleCudaSharedMemory's order: ``raw_handle``, its ``b64``, ``byte_size``,
    ``device_id``, then the decoded handle's size.

    Raises:
        InvalidRequest: no ``raw_handle`` ("Shared memory register request has no
            'raw_handle' field"), a handle of other than ``handle_bytes`` bytes
            ("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t").
        TritonMPError: INTERNAL with TritonJson's words for a missing ``b64``,
            ``byte_size`` or ``device_id``, or one of the wrong type.
    """
    if "raw_handle" not in body:
        raise InvalidRequest("Shared memory register request has no 'raw_handle' field")
    raw = body["raw_handle"]
    b64 = json_string(raw if isinstance(raw, dict) else {}, "b64", "")
    byte_size = json_uint(body, "byte_size", "")
    device_id = json_uint(body, "device_id", "")
    handle = libb64_decode(b64)
    if len(handle) != handle_bytes:
        raise InvalidRequest("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return handle, byte_size, device_id
