"""End to end: an onnxruntime model's batches whose requests all read one client window.

perf_analyzer's shared-memory requests all name one registered region; a batch of them
reads one window several times. The onnxruntime backend never writes its inputs
(``OnnxRuntimeBackend.writes_inputs``), so the worker views that window once per request
without a copy each (``workers.tensors.tensor_io.ClientRegions``, ``copy_overlaps``): every
answer is still its own, the client's bytes stay as written, and the batches did hold
several requests. (A python model writing such inputs in place keeps its copies:
``test_r20_shm_input_writes.py``.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(
            PROJECT_REPOSITORY,
            "--model-control-mode",
            "explicit",
            "--load-model",
            "add_sub",
            "--allow-client-shm=true",
        )


def _infer(server: ServerProcess, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    client = server.client()
    try:
        out = []
        for _ in range(n):
            inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("s20_window", 64, offset=0)
            inputs[1].set_shared_memory("s20_window", 64, offset=64)
            res = client.infer("add_sub", inputs)
            out.append((res.as_numpy("OUTPUT0"), res.as_numpy("OUTPUT1")))
        return out
    finally:
        client.close()


def test_concurrent_requests_on_one_window_each_get_their_answer(server: ServerProcess) -> None:
    key = f"/s20_window_{os.getpid()}"
    handle = shm.create_shared_memory_region("s20_window", key, 128)
    client = server.client()
    try:
        shm.set_shared_memory_region(handle, [A, B])
        client.register_system_shared_memory("s20_window", key, 128)
        before = client.get_inference_statistics("add_sub").model_stats[0]
        with ThreadPoolExecutor(16) as pool:
            answers = [a for part in pool.map(_infer, [server] * 16, [25] * 16) for a in part]
        assert len(answers) == 400
        for plus, minus in answers:
            np.testing.assert_array_equal(plus, A + B)
            np.testing.assert_array_equal(minus, A - B)
        after = client.get_inference_statistics("add_sub").model_stats[0]
        inferences = after.inference_count - before.inference_count
        executions = after.execution_count - before.execution_count
        assert inferences == 400
        assert executions < inferences  # batches of several requests on the one window
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(handle, np.float32, [2, 16]), np.concatenate([A, B])
        )
        client.unregister_system_shared_memory("s20_window")
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle)
