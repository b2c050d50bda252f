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
from triton_mp.frontend.request import Parameters, ParameterType
from triton_mp.frontend.shm.system import SystemShmRegistry

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


_UINT64 = (1 << 64) - 1


def shm_parameters(params: Parameters, tensor: str) -> tuple[str, int, int] | None:
    """A tensor's ``shared_memory_*`` parameters as server ``grpc_utils.h``
    ``ParseSharedMemoryParams`` reads them (HTTP's codec always gives a well-formed set).

    Args:
        params: the tensor's parameters.
        tensor: the input's or output's name, for messages.

    Returns:
        None when the tensor is not in shared memory; else the region's name, the offset
        and the byte size in bytes, read as unsigned as Triton's ``size_t`` holds them
        (an ``int64_param`` of -1 is 2**64-1).

    Raises:
        InvalidRequest: a region that is not a ``string_param``, an offset or byte size
            without a region or not an ``int64_param``, a region without a byte size (no
            ``[request id: ...]`` prefix: the frontend refuses these).
    """
    region = params.get(REGION_PARAMETER)
    offset = params.get("shared_memory_offset")
    size = params.get("shared_memory_byte_size")
    if region is None and offset is None and size is None:
        return None
    where = f"parameter for tensor '{tensor}'"
    if region is not None and region.type is not ParameterType.STRING:
        raise InvalidRequest(
            f"invalid value type for 'shared_memory_region' {where}, expected string_param."
        )
    values = []
    for key, p in (("shared_memory_offset", offset), ("shared_memory_byte_size", size)):
        if p is None:
            values.append(0)
            continue
        if region is None:
            raise InvalidRequest(
                f"'{key}' can not be specified without 'shared_memory_region' {where}"
            )
        if p.type is not ParameterType.INT64 or not isinstance(p.value, int):
            raise InvalidRequest(
                f"invalid value type for '{key}' parameter for tensor '{tensor}', expected "
                "int64_param."
            )
        values.append(p.value & _UINT64)
    if size is None:
        raise InvalidRequest(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' {where}"
        )
    assert region is not None
    return region.string, values[0], values[1]


def shm_window(shm: SystemShmRegistry | None, params: Parameters, tensor: str) -> ShmWindow:
    """Resolve a tensor's ``shared_memory_*`` parameters against the registered regions.

    Args:
        shm: the frontend's registry (None: no region is known).
        params: the tensor's parameters (``uses_shm`` is true).
        tensor: the input's or output's name, for messages.

    Raises:
        InvalidRequest: malformed parameters (``shm_parameters``), a window outside the
            region.
        TritonMPError: NOT_FOUND for an unknown region; UNSUPPORTED when client shared
            memory is disabled.
    """
    parsed = shm_parameters(params, tensor)
    assert parsed is not None
    name, offset, byte_size = parsed
    if shm is None:
        raise TritonMPError(f"Unable to find shared memory region: '{name}'", ErrorCode.NOT_FOUND)
    region = shm.window(name, offset, byte_size)
    return ShmWindow(name, region.object_name, region.region_id, region.offset + offset, byte_size)
