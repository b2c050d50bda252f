"""The GPU checks of issue #20, for a machine with an NVIDIA GPU (``scripts/gpu_check.sh``).

Marked ``gpu`` and skipped where torch sees no CUDA device, so CI (no GPU) collects and skips
them. Each test starts ``triton-mp start`` on the real NVML and checks one thing the CPU tests
cannot: a TorchScript model on KIND_GPU answers as torch on the GPU does; two instances on the
one device each see only their own GPU (by UUID); the ``nv_gpu_*`` families appear with the
device's UUID; a client's CUDA IPC handle registers (tritonclient.utils.cuda_shared_memory)
and ``ipc.memory.cuda_ipc`` maps another process's device memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import write_python_model
from tests.helpers.server import REPO_ROOT, ServerProcess

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

WIDTH = 256


def _mlp_repo(repo: Path, count: int = 1) -> None:
    from tests.helpers.torch_models import Mlp, save

    save(Mlp(width=WIDTH, depth=4, seed=5), repo / "mlp_gpu" / "1" / "model.pt")
    (repo / "mlp_gpu" / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""
            platform: "pytorch_libtorch"
            max_batch_size: 64
            input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
            dynamic_batching {{ max_queue_delay_microseconds: 200 }}
            instance_group [ {{ kind: KIND_GPU count: {count} }} ]
            """
        )
    )


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        return str(r.read().decode())


def test_torchscript_on_kind_gpu_matches_torch_on_the_gpu(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    from tests.helpers.torch_models import Mlp

    _mlp_repo(tmp_path / "repo")
    server = start_server(tmp_path / "repo")
    direct = Mlp(width=WIDTH, depth=4, seed=5).cuda().eval()
    x = np.random.default_rng(0).standard_normal((8, WIDTH), dtype=np.float32)
    with server.client() as client:
        inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("mlp_gpu", [inp]).as_numpy("OUTPUT__0")
    with torch.no_grad():
        want = direct(torch.from_numpy(x).cuda()).cpu().numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert "ready on cuda:0" in server.log()
    uuid = torch.cuda.get_device_properties(0).uuid
    metrics = _metrics(server)
    assert f'nv_gpu_memory_total_bytes{{gpu_uuid="GPU-{uuid}"}}' in metrics
    assert "nv_gpu_utilization{" in metrics
    assert "nv_energy_consumption{" in metrics


WHERE = """
import json, os
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        seen = {
            "name": args["model_instance_name"],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": torch.cuda.device_count(),
            "uuid": "GPU-" + str(torch.cuda.get_device_properties(0).uuid),
        }
        with open(os.path.join(REPORTS, f"{os.getpid()}.json"), "w") as f:
            json.dump(seen, f)

    def execute(self, requests):
        out = pb_utils.Tensor("OUT", np.zeros([1], dtype=np.int32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""


def test_two_instances_on_one_gpu_each_see_only_it(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    write_python_model(
        tmp_path / "repo",
        "where",
        """
        backend: "python"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]
        """,
        WHERE.replace("REPORTS", repr(str(reports))),
    )
    start_server(tmp_path / "repo")
    seen = [json.loads(p.read_text()) for p in reports.glob("*.json")]
    assert len(seen) == 2
    for s in seen:
        assert s["devices"] == 1
        assert s["visible"] == s["uuid"]


def test_cuda_shared_memory_registers_a_real_handle(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    _mlp_repo(tmp_path / "repo")
    server = start_server(tmp_path / "repo")
    x = np.ones((1, WIDTH), dtype=np.float32)
    handle = cudashm.create_shared_memory_region("in", x.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(handle, [x])
        with server.client() as client:
            client.register_cuda_shared_memory("in", cudashm.get_raw_handle(handle), 0, x.nbytes)
            (status,) = client.get_cuda_shared_memory_status("in").regions.values()
            assert (status.device_id, status.byte_size) == (0, x.nbytes)
            client.unregister_cuda_shared_memory("in")
    finally:
        cudashm.destroy_shared_memory_region(handle)


PRODUCER = """
import sys, time, torch
from triton_mp.ipc.memory import cuda_ipc
t = torch.arange(16, dtype=torch.float32, device="cuda") * 3
sys.stdout.write(cuda_ipc.get_handle(t.data_ptr()).hex() + "\\n")
sys.stdout.flush()
sys.stdin.readline()
"""


def test_cuda_ipc_maps_another_process_memory() -> None:
    from triton_mp.ipc.memory import cuda_ipc

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), *sys.path])}
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert producer.stdout is not None
        assert producer.stdin is not None
        raw = bytes.fromhex(producer.stdout.readline().strip())
        cache = cuda_ipc.HandleCache()
        ptr = cache.pointer(raw)
        assert cache.pointer(raw) == ptr  # opened once per process
        host = np.empty(16, dtype=np.float32)
        from cuda.bindings import runtime as rt

        (err,) = rt.cudaMemcpy(host.ctypes.data, ptr, 64, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        assert int(err) == 0
        np.testing.assert_array_equal(host, np.arange(16, dtype=np.float32) * 3)
        cache.close()
        producer.stdin.write("\n")
        producer.stdin.flush()
    finally:
        producer.wait(timeout=30)
