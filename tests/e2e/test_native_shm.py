"""Calls naming client system shared-memory regions on the native known path
(``frontend.native.known_teach``, ``known_regions.h``), driven by tritonclient's
system-shm utilities and by perf_analyzer ``--shared-memory system``.

Once Python taught a key whose inputs and outputs name registered regions, the gRPC thread
submits each call itself (the record names the region windows, nothing is copied) and C++
answers it (the worker wrote the outputs in the client's region; the response is the head
Python taught): the outputs are checked in the region, call by call, and the native
counters say which way each call went. Every registration change un-teaches; a region
unregistered between calls gets the Python frontend's exact error, side by side; a region
that a natively sent call still uses is refused in Python's words (Triton's "in use"), and
is unregistered once the call is answered.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory
from tests.helpers.triton_peer import require_peers
from triton_mp.frontend.native import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="the native extension is not built"),
]

N = 4096
"""identity_batched_py's elements per call (FP32: 16 KiB)."""

# NOTE: a batching delay: a version the direct handoff serves (``ipc.direct.handoff_eligible``:
# identity_py, no batcher) is never sent by the known lane's records (``Inference._plain``).
IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 4
dynamic_batching { max_queue_delay_microseconds: 100 }
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""
SLOW_CONFIG = """
backend: "python"
max_batch_size: 4
dynamic_batching { max_queue_delay_microseconds: 100 }
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
SLOW_MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if int(x[0, 0]) < 0:
                time.sleep(1.5)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    repo = tmp_path_factory.mktemp("native_shm")
    write_python_model(repo, "identity_batched_py", IDENTITY_CONFIG, IDENTITY_MODEL)
    write_python_model(repo, "slow_shm_py", SLOW_CONFIG, SLOW_MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        both = {
            f: start(repo, "--grpc-frontend", f, "--allow-client-shm=true", wait=False)
            for f in ("native", "python")
        }
        for server in both.values():
            server.wait_live()
        yield both


_KNOWN_SAMPLE = re.compile(
    r'^triton_mp_frontend_native_known_calls_total\{outcome="(\w+)"\} (\S+)$', re.M
)


def _known_counts(server: ServerProcess) -> dict[str, float]:
    """The native gRPC thread's known calls by outcome (``GET /metrics``)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {m[1]: float(m[2]) for m in _KNOWN_SAMPLE.finditer(text)}


class Regions:
    """Client objects under the suite's test prefix, destroyed at the end."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def make(self, tag: str, byte_size: int) -> Any:
        key = f"/triton_mp_{os.getpid()}_test_nshm_{tag}"
        handle = shm.create_shared_memory_region(tag, key, byte_size, create_only=True)
        self.made.append((handle, key))
        return handle

    def key(self, handle: Any) -> str:
        return next(k for h, k in self.made if h is handle)

    def close(self) -> None:
        for handle, _ in self.made:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.close()


def _identity_call(
    client: grpcclient.InferenceServerClient, name_in: str, name_out: str, rid: str = "s"
) -> grpcclient.InferResult:
    inp = grpcclient.InferInput("INPUT0", [1, N], "FP32")
    inp.set_shared_memory(name_in, N * 4)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(name_out, N * 4)
    return client.infer("identity_batched_py", [inp], outputs=[out], request_id=rid)


def _register(client: grpcclient.InferenceServerClient, regions: Regions, tag: str) -> Any:
    handle = regions.make(tag, N * 4)
    client.register_system_shared_memory(tag, regions.key(handle), N * 4)
    return handle


def test_region_calls_are_sent_and_answered_natively_with_outputs_in_the_region(
    servers: dict[str, ServerProcess], regions: Regions
) -> None:
    """After the first calls (the full way, the Python lane that keeps the record template,
    the one that teaches), every call of the key and id is submitted and answered by C++:
    each output is the call's own input, read back from the client's output region, and
    the response names the output with no bytes in it."""
    server = servers["native"]
    client = grpcclient.InferenceServerClient(server.url)
    try:
        h_in = _register(client, regions, "ni_in")
        h_out = _register(client, regions, "ni_out")
        before = _known_counts(server)
        for i in range(16):
            data = np.arange(N, dtype=np.float32) + i
            shm.set_shared_memory_region(h_in, [data])
            result = _identity_call(client, "ni_in", "ni_out")
            response = result.get_response()
            assert response.id == "s"
            assert [o.name for o in response.outputs] == ["OUTPUT0"]
            assert list(response.raw_output_contents) in ([], [b""])
            got = shm.get_contents_as_numpy(h_out, np.float32, [N])
            np.testing.assert_array_equal(got, data)
        after = _known_counts(server)
    finally:
        client.unregister_system_shared_memory()
        client.close()
    sent = after["sent"] - before["sent"]
    assert sent >= 12, (before, after)
    # NOTE: the first native call's answer has no head yet: Python answers it and teaches
    assert after["answered"] - before["answered"] >= sent - 1, (before, after)
    assert "Traceback" not in server.log()


def _sequence(server: ServerProcess, regions: Regions, tag: str) -> list[tuple[str, str]]:
    """Calls until sent natively, then the output region unregistered (no call in flight),
    then the same call: (status, message) of each step, for the side by side."""
    client = grpcclient.InferenceServerClient(server.url)
    steps: list[tuple[str, str]] = []
    try:
        h_in = _register(client, regions, f"{tag}_in")
        _register(client, regions, f"{tag}_out")
        shm.set_shared_memory_region(h_in, [np.ones(N, np.float32)])
        for _ in range(8):
            _identity_call(client, f"{tag}_in", f"{tag}_out")
        client.unregister_system_shared_memory(f"{tag}_out")
        steps.append(("OK", "unregistered"))
        for _ in range(2):
            try:
                _identity_call(client, f"{tag}_in", f"{tag}_out")
                steps.append(("OK", ""))
            except InferenceServerException as e:
                steps.append((str(e.status()), e.message().replace(tag, "<tag>")))
    finally:
        client.unregister_system_shared_memory()
        client.close()
    return steps


def test_a_region_unregistered_between_native_calls_gets_pythons_error(
    servers: dict[str, ServerProcess], regions: Regions
) -> None:
    """The unregistration un-teaches before it is made: the next call goes to Python,
    which answers it as the Python frontend does (Triton's NOT_FOUND words)."""
    before = _known_counts(servers["native"])
    native = _sequence(servers["native"], regions, "nu")
    after = _known_counts(servers["native"])
    python = _sequence(servers["python"], regions, "pu")
    assert native == python
    assert native[1] == (
        "StatusCode.NOT_FOUND",
        "Unable to find shared memory region: '<tag>_out'",
    ), native
    assert after["sent"] - before["sent"] >= 4, (before, after)
    assert after["cleared"] > before["cleared"]


def test_a_region_registered_again_under_its_name_is_read_and_written_at_its_new_window(
    servers: dict[str, ServerProcess], regions: Regions
) -> None:
    """The key of a call names a region by name, offset and byte size only, so the same
    request bytes name another window once the region is registered again under its name
    (the same object at another offset, or another object): the lessons taught before are
    never used again, and the natively sent calls read and write the new windows."""
    server = servers["native"]
    client = grpcclient.InferenceServerClient(server.url)
    size = 2 * N * 4  # NOTE: two windows, the second at a page-aligned offset
    objects = {tag: regions.make(f"rw_{tag}", size) for tag in ("a", "b", "oa", "ob")}
    shm.set_shared_memory_region(objects["a"], [np.full(2 * N, 1, np.float32)])
    shm.set_shared_memory_region(objects["b"], [np.full(2 * N, 3, np.float32)])
    shm.set_shared_memory_region(objects["a"], [np.full(N, 2, np.float32)], offset=N * 4)
    # (input object, offset, output object, offset, value read)
    phases = [("a", 0, "oa", 0, 1), ("a", N * 4, "oa", N * 4, 2), ("b", 0, "ob", 0, 3)]
    sent = []
    try:
        for in_obj, in_at, out_obj, out_at, value in phases:
            client.unregister_system_shared_memory()
            client.register_system_shared_memory(
                "rw_in", regions.key(objects[in_obj]), N * 4, in_at
            )
            client.register_system_shared_memory(
                "rw_out", regions.key(objects[out_obj]), N * 4, out_at
            )
            before = _known_counts(server)["sent"]
            for _ in range(5):
                for o in ("oa", "ob"):
                    shm.set_shared_memory_region(objects[o], [np.zeros(2 * N, np.float32)])
                _identity_call(client, "rw_in", "rw_out")
                for o in ("oa", "ob"):
                    got = shm.get_contents_as_numpy(objects[o], np.float32, [2, N])
                    for at in (0, 1):
                        want = value if (o, at * N * 4) == (out_obj, out_at) else 0
                        assert (got[at] == want).all(), (in_obj, in_at, o, at, got[at][:2])
            sent.append(_known_counts(server)["sent"] - before)
    finally:
        client.unregister_system_shared_memory()
        client.close()
    # NOTE: each phase: the full way, the Python lane that teaches, then native calls
    assert min(sent) >= 2, sent
    assert "Traceback" not in server.log()


def _slow_call(
    client: grpcclient.InferenceServerClient, name: str, value: int
) -> grpcclient.InferResult:
    inp = grpcclient.InferInput("IN", [1, 1], "INT32")
    inp.set_shared_memory(name, 4)
    return client.infer("slow_shm_py", [inp], request_id="slow")


def test_a_region_a_native_call_uses_cannot_be_unregistered_until_it_is_answered(
    servers: dict[str, ServerProcess], regions: Regions
) -> None:
    """A call the gRPC thread sent holds its region (C++ counts it; Python's ``in_use``
    adds it): unregistering the region meanwhile is refused with Triton's INTERNAL "in
    use", and succeeds once the call is answered."""
    server = servers["native"]
    client = grpcclient.InferenceServerClient(server.url)
    handle = regions.make("slow_in", 4)
    client.register_system_shared_memory("slow_in", regions.key(handle), 4)
    try:
        shm.set_shared_memory_region(handle, [np.array([3], np.int32)])
        for _ in range(6):  # NOTE: taught, then sent natively
            assert _slow_call(client, "slow_in", 3).as_numpy("OUT").tolist() == [[3]]
        before = _known_counts(server)
        shm.set_shared_memory_region(handle, [np.array([-1], np.int32)])  # NOTE: sleeps
        done: list[Any] = []
        worker = threading.Thread(target=lambda: done.append(_slow_call(client, "slow_in", -1)))
        worker.start()
        deadline = time.monotonic() + 5
        while _known_counts(server)["sent"] == before["sent"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _known_counts(server)["sent"] == before["sent"] + 1
        with pytest.raises(InferenceServerException) as refused:
            client.unregister_system_shared_memory("slow_in")
        assert refused.value.message() == (
            "Cannot unregister shared memory region 'slow_in', it is currently in use."
        )
        assert str(refused.value.status()) == "StatusCode.INTERNAL"
        worker.join(30)
        assert done
        assert done[0].as_numpy("OUT").tolist() == [[-1]]
        client.unregister_system_shared_memory("slow_in")
        assert "slow_in" not in client.get_system_shared_memory_status().regions
    finally:
        client.unregister_system_shared_memory()
        client.close()
    assert "Traceback" not in server.log()


def test_perf_analyzer_with_system_shared_memory_goes_native(
    servers: dict[str, ServerProcess],
) -> None:
    """perf_analyzer ``--shared-memory system`` (its own regions, registered once, every
    call naming them): nearly every call is submitted and answered natively, and
    perf_analyzer's own unregistration at the end succeeds (every hold was released)."""
    env = require_peers("PERF_ANALYZER")
    server = servers["native"]
    before = _known_counts(server)
    # NOTE: a loose stability: the point is the calls, not the figure (a shared machine)
    out = subprocess.run(
        [
            env["PERF_ANALYZER"], "-m", "identity_batched_py", "-i", "grpc", "-u", server.url,
            "--shape", f"INPUT0:{N}", "-b", "1", "--shared-memory", "system",
            "--output-shared-memory-size", str(N * 4), "--concurrency-range", "2",
            "--measurement-mode", "count_windows", "--measurement-request-count", "200",
            "--max-trials", "3", "-s", "1000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    after = _known_counts(server)
    sent = after["sent"] - before["sent"]
    assert sent >= 100, (before, after)
    assert after["answered"] - before["answered"] >= sent - 4, (before, after)
    assert "Traceback" not in server.log()
