"""End to end: Triton's CUDA shared memory extension over gRPC and HTTP/REST on a CPU host.

What the real Triton 2.51 answers on a host without GPUs (read off it: a GPU build cannot
open any handle) is what triton-mp must answer: registration fails with INVALID_ARG "failed
to register shared memory region: invalid args" after the format checks, status lists
nothing and names an unknown region NOT_FOUND, unregistering an unknown name succeeds. With
the test-only fake GPUs the region table itself is exercised: register, status of one and
all, the one name table shared with system shared memory, unregister; naming a CUDA region
in a request is refused (the workers do not use device memory in place yet).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from urllib import request as urlrequest
from urllib.error import HTTPError

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models
from tests.helpers.server import ServerProcess
from triton_mp.common.process.gpus import FAKE_GPUS_ENV, discover

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HANDLE = bytes(range(64))
B64 = base64.b64encode(HANDLE)
"""tritonclient takes the handle base64-encoded (as cuda_shared_memory.get_raw_handle gives it)."""
INVALID = "failed to register shared memory region: invalid args"


def _post(server: ServerProcess, path: str, body: object) -> tuple[int, str]:
    req = urlrequest.Request(
        f"http://{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urlrequest.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except HTTPError as e:
        return e.code, json.loads(e.read())["error"]


def _err(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.status()), str(e.value.message())


def test_cpu_host_answers_as_triton_does(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    if discover(env={}).gpus:
        pytest.skip("this host has GPUs")
    server = start_server(copy_models(tmp_path / "repo", "add_sub"), "--allow-client-shm=true")
    with grpcclient.InferenceServerClient(server.url) as gc:
        assert _err(lambda: gc.register_cuda_shared_memory("r", B64, 0, 16)) == (
            "StatusCode.INVALID_ARGUMENT",
            INVALID,
        )
        assert list(gc.get_cuda_shared_memory_status().regions) == []
        assert _err(lambda: gc.get_cuda_shared_memory_status("r")) == (
            "StatusCode.NOT_FOUND",
            "Unable to find cuda shared memory region: 'r'",
        )
        gc.unregister_cuda_shared_memory("r")
        gc.unregister_cuda_shared_memory()
    with httpclient.InferenceServerClient(server.http_url) as hc:
        assert _err(lambda: hc.register_cuda_shared_memory("r", B64, 0, 16))[1] == INVALID
        assert hc.get_cuda_shared_memory_status() == []
        hc.unregister_cuda_shared_memory("r")
    assert _post(server, "/v2/cudasharedmemory/region/r/register", {"byte_size": 16}) == (
        400,
        "Shared memory register request has no 'raw_handle' field",
    )
    short = {"raw_handle": {"b64": base64.b64encode(b"abc").decode()}, "byte_size": 16}
    assert _post(server, "/v2/cudasharedmemory/region/r/register", {**short, "device_id": 0}) == (
        400,
        "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
    )
    assert _post(server, "/v2/cudasharedmemory/register", {}) == (
        400,
        "'region name' is necessary to register cuda shared memory region",
    )


def test_regions_on_fake_gpus(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAKE_GPUS_ENV, json.dumps([{"uuid": "GPU-12345678-aaaa"}]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = start_server(copy_models(tmp_path / "repo", "add_sub"), "--allow-client-shm=true")
    with grpcclient.InferenceServerClient(server.url) as gc:
        gc.register_cuda_shared_memory("in", B64, 0, 128)
        assert _err(lambda: gc.register_cuda_shared_memory("in", B64, 0, 128)) == (
            "StatusCode.ALREADY_EXISTS",
            "shared memory region 'in' already in manager",
        )
        # NOTE: device 1 is no GPU of this server: Triton could not open the handle there.
        assert _err(lambda: gc.register_cuda_shared_memory("x", B64, 1, 128))[1] == INVALID
        (status,) = gc.get_cuda_shared_memory_status("in").regions.values()
        assert (status.name, status.device_id, status.byte_size) == ("in", 0, 128)
        assert _err(lambda: gc.get_system_shared_memory_status("in")) == (
            "StatusCode.NOT_FOUND",
            "The region named 'in' is registered as CUDA shared memory, not system shared memory",
        )
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_shared_memory("in", 64)
        other = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        other.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        status_code, message = _err(lambda: gc.infer("add_sub", [inp, other]))
        assert status_code == "StatusCode.UNIMPLEMENTED"
        assert "uses CUDA shared memory region 'in'" in message
    with httpclient.InferenceServerClient(server.http_url) as hc:
        assert hc.get_cuda_shared_memory_status() == [
            {"name": "in", "device_id": 0, "byte_size": 128}
        ]
        hc.unregister_cuda_shared_memory()
        assert hc.get_cuda_shared_memory_status() == []


def test_disabled_client_shm_refuses_cuda_calls(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(copy_models(tmp_path / "repo", "add_sub"), "--allow-client-shm=false")
    with grpcclient.InferenceServerClient(server.url) as gc:
        code, message = _err(lambda: gc.register_cuda_shared_memory("r", B64, 0, 16))
    assert code == "StatusCode.UNIMPLEMENTED"
    assert message.startswith("Client shared memory is disabled.")
