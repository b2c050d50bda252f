"""One system shared-memory key registered under two names, side by side with the real Triton
2.51 on the session's shared pair (docs/differences.md, "Newer than 2.51").

2.51's shared-memory manager reuses the descriptor of a key already registered, which it closed
after mapping the first region: the second registration's ``fstat`` fails and the call is
refused INTERNAL (HTTP 500) "Invalid shared memory region: '<key>'" (its FIXME "Consider
invalid file descriptors after close"). Upstream main opens the key again for every
registration (server PR #8733), so two windows of one object can be registered; triton-mp
does the same, and each name serves its own window.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "r26_shm_identity": PythonModel(
        """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
    )
}
"""r26_shm_identity: INPUT0 FP32 [4] answered as OUTPUT0 (tests/e2e/conftest.py's
``shared_side_by_side`` serves it, with client shared memory on in both)."""

WINDOW = 16
"""Bytes of one FP32 [4] tensor."""

SECOND = mmap.PAGESIZE
"""Where the second window starts (a registration's offset is mapped: a page multiple)."""


@pytest.fixture
def two_windows() -> Iterator[str]:
    """A POSIX shared-memory object of two pages, 0..3 (FP32) at its start and 10..13 at
    ``SECOND``; its key. Destroyed at the end."""
    key = f"/r26_same_key_{os.getpid()}"
    handle = shm.create_shared_memory_region("r26_same_key", key, 2 * SECOND)
    try:
        shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
        shm.set_shared_memory_region(handle, [np.arange(10, 14, dtype=np.float32)], offset=SECOND)
        yield key
    finally:
        shm.destroy_shared_memory_region(handle)


def _register_twice(client: object, key: str) -> str:
    """Register ``key``'s two windows as r26_first and r26_second: "OK", or the second
    registration's refusal as "<status>: <message>"."""
    c: object = client
    c.register_system_shared_memory("r26_first", key, WINDOW)  # type: ignore[attr-defined]
    try:
        c.register_system_shared_memory("r26_second", key, WINDOW, offset=SECOND)  # type: ignore[attr-defined]
    except InferenceServerException as e:
        return f"{e.status()}: {e.message()}"
    return "OK"


def _read(client: object, module: object, region: str) -> list[float]:
    """r26_shm_identity's answer to INPUT0 read from ``region``."""
    t = module.InferInput("INPUT0", [4], "FP32")  # type: ignore[attr-defined]
    t.set_shared_memory(region, WINDOW)
    result = client.infer("r26_shm_identity", [t])  # type: ignore[attr-defined]
    answer: list[float] = result.as_numpy("OUTPUT0").tolist()
    return answer


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_one_key_under_two_names(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], two_windows: str, module: object
) -> None:
    """triton-mp: both registrations hold, each serving its own window."""
    grpc_url, http_url = urls_of(shared_side_by_side, "triton-mp")
    c = module.InferenceServerClient(grpc_url if module is grpcclient else http_url)  # type: ignore[attr-defined]
    try:
        assert _register_twice(c, two_windows) == "OK"
        assert _read(c, module, "r26_first") == [0.0, 1.0, 2.0, 3.0]
        assert _read(c, module, "r26_second") == [10.0, 11.0, 12.0, 13.0]
    finally:
        c.unregister_system_shared_memory("r26_first")
        c.unregister_system_shared_memory("r26_second")
        c.close()


@pytest.mark.parametrize(
    ("module", "status"),
    [(grpcclient, "StatusCode.INTERNAL"), (httpclient, "500")],
    ids=["grpc", "http"],
)
def test_triton_refuses_a_registered_key_under_a_second_name(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
    two_windows: str,
    module: object,
    status: str,
) -> None:
    """2.51 (the difference kept): the second registration is refused, the first serves."""
    grpc_url, http_url = urls_of(shared_side_by_side, "triton")
    c = module.InferenceServerClient(grpc_url if module is grpcclient else http_url)  # type: ignore[attr-defined]
    try:
        refused = _register_twice(c, two_windows)
        assert refused == f"{status}: Invalid shared memory region: '{two_windows}'"
        assert _read(c, module, "r26_first") == [0.0, 1.0, 2.0, 3.0]
    finally:
        c.unregister_system_shared_memory("r26_first")
        c.close()
