"""Tensors in a client's registered system shared memory: the window a tensor names.

Imported by ``frontend.validation``. A tensor that sets ``shared_memory_region`` (with
``shared_memory_byte_size`` and optionally ``shared_memory_offset``) has its bytes in a
region registered with ``SystemSharedMemoryRegister`` instead of the request; this module
checks the parameters and resolves them against the frontend's registry (messages from
server ``infer_handler.cc`` / ``shared_memory_manager.cc``).
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.client_shm import SystemShmRegistry
from triton_mp.frontend.request import Parameters
from triton_mp.frontend.validation.parameters import int_param

REGION_PARAMETER = "shared_memory_region"
"""The tensor parameter naming a registered region."""


@dataclass(frozen=True, slots=True)
class ShmWindow:
    """The part of a client's shared-memory object a tensor names (absolute offsets).

    Attributes:
        name: the region's registered name.
        key: the POSIX shared-memory object (``/something``).
        region_id: the registration's server-wide id.
        offset: where the tensor starts in the object, in bytes.
        byte_size: the tensor's length in bytes.
    """

    name: str
    key: str
    region_id: int
    offset: int
    byte_size: int


def uses_shm(params: Parameters) -> bool:
    """Whether a tensor's parameters put it in shared memory."""
    return REGION_PARAMETER in params


def shm_window(shm: SystemShmRegistry | None, params: Parameters, what: str, rid: str) -> ShmWindow:
    """Resolve a tensor's ``shared_memory_*`` parameters against the registered regions.

    Args:
        shm: the frontend's registry (None: no region is known).
        params: the tensor's parameters (``uses_shm`` is true).
        what: ``input '<name>'`` or ``output '<name>'``, for messages.
        rid: ``"[request id: <id>] "``.

    Raises:
        InvalidRequest: no ``shared_memory_byte_size``, a malformed offset or size, a
            window outside the region.
        TritonMPError: NOT_FOUND for an unknown region; UNSUPPORTED when client shared
            memory is disabled.
    """
    name = params[REGION_PARAMETER].string
    if "shared_memory_byte_size" not in params:
        raise InvalidRequest(
            f"{rid}'shared_memory_byte_size' parameter is required for {what} using shared "
            f"memory region '{name}'"
        )
    byte_size = int_param(params["shared_memory_byte_size"], "shared_memory_byte_size", rid)
    offset = 0
    if "shared_memory_offset" in params:
        offset = int_param(params["shared_memory_offset"], "shared_memory_offset", rid)
    if shm is None:
        raise TritonMPError(f"Unable to find shared memory region: '{name}'", ErrorCode.NOT_FOUND)
    region = shm.window(name, offset, byte_size)
    return ShmWindow(name, region.key, region.region_id, region.offset + offset, byte_size)
