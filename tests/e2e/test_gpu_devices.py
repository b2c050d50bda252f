"""End to end: GPU instance groups on a CPU host, with the test-only fake device list.

``TRITON_MP_TEST_FAKE_GPUS`` stands in for NVML (``common.process.gpus``), so what is tested here is
the server's side of the GPU path: which instances a config makes, that each GPU worker
process starts with only its own device visible (``CUDA_VISIBLE_DEVICES`` = that GPU's UUID),
``--min-supported-compute-capability``, and Triton's refusal of KIND_GPU where there is no GPU
(with KIND_AUTO falling back to CPU). A python model reports what its process sees: python
models place themselves, so they load on a fake GPU (CUDA is never touched).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from triton_mp.common.process.gpus import FAKE_GPUS_ENV, discover

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

UUIDS = ("GPU-0a0a0a0a-1111-2222-3333-444444444444", "GPU-0b0b0b0b-1111-2222-3333-444444444444")
FAKE = json.dumps(
    [
        {
            "uuid": UUIDS[0],
            "name": "Fake A",
            "compute_capability": "9.0",
            "utilization": 0.25,
            "memory_total_bytes": 8 << 30,
            "memory_used_bytes": 1 << 30,
            "power_usage_w": 90.5,
            "power_limit_w": 300,
        },
        {"uuid": UUIDS[1], "name": "Fake B", "compute_capability": "7.0"},
    ]
)

# Each instance writes what its process sees into REPORTS at initialize, and answers the
# CUDA_VISIBLE_DEVICES it runs with.
WHERE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VISIBLE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ {GROUP} ]
"""
WHERE_MODEL = """
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

REPORTS = {reports!r}


class TritonPythonModel:
    def initialize(self, args):
        seen = {{
            "name": args["model_instance_name"],
            "kind": args["model_instance_kind"],
            "device": args["model_instance_device_id"],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid(),
        }}
        path = os.path.join(REPORTS, f"{{os.getpid()}}.json")
        with open(path, "w") as f:
            json.dump(seen, f)

    def execute(self, requests):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>").encode()
        out = pb_utils.Tensor("VISIBLE", np.array([visible], dtype=np.object_))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""


def _model(repo: Path, name: str, group: str, reports: Path) -> None:
    reports.mkdir(parents=True, exist_ok=True)
    write_python_model(
        repo,
        name,
        WHERE_CONFIG.replace("{GROUP}", group),
        WHERE_MODEL.format(reports=str(reports)),
    )


def _reports(reports: Path) -> list[dict[str, object]]:
    return sorted(
        (json.loads(p.read_text()) for p in reports.glob("*.json")),
        key=lambda r: (str(r["name"]), str(r["device"])),
    )


def _metrics(server: ServerProcess) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def test_gpu_instances_each_see_only_their_device(
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = tmp_path / "repo"
    reports = tmp_path / "reports"
    _model(repo, "where", "{ count: 2 kind: KIND_GPU }", reports / "where")
    _model(repo, "cpu", "{ count: 1 kind: KIND_CPU }", reports / "cpu")
    monkeypatch.setenv(FAKE_GPUS_ENV, FAKE)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUIDS[1]},{UUIDS[0]}")
    server = start_server(repo)
    seen = _reports(reports / "where")
    # NOTE: count 2 per GPU, CUDA ordinals in CUDA_VISIBLE_DEVICES's order, one process each.
    assert [(r["name"], r["kind"], r["device"], r["visible"]) for r in seen] == [
        ("where_0_0", "GPU", "0", UUIDS[1]),
        ("where_0_0", "GPU", "1", UUIDS[0]),
        ("where_0_1", "GPU", "0", UUIDS[1]),
        ("where_0_1", "GPU", "1", UUIDS[0]),
    ]
    assert len({r["pid"] for r in seen}) == 4
    (cpu,) = _reports(reports / "cpu")
    # KIND_CPU instances see what the server sees, as in Triton.
    assert (cpu["kind"], cpu["visible"]) == ("CPU", f"{UUIDS[1]},{UUIDS[0]}")
    with server.client() as client:
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        answer = client.infer("where", [inp]).as_numpy("VISIBLE")[0].decode()
        assert answer in UUIDS
        assert "FAKE GPUs" in server.log()
    metrics = _metrics(server).splitlines()
    assert f'nv_gpu_utilization{{gpu_uuid="{UUIDS[0]}"}} 0.25' in metrics
    assert f'nv_gpu_memory_used_bytes{{gpu_uuid="{UUIDS[0]}"}} 1073741824' in metrics
    assert f'nv_gpu_power_usage{{gpu_uuid="{UUIDS[0]}"}} 90.5' in metrics
    assert f'nv_gpu_power_limit{{gpu_uuid="{UUIDS[1]}"}} 0' in metrics
    assert f'nv_energy_consumption{{gpu_uuid="{UUIDS[1]}"}} 0' in metrics


def test_min_compute_capability_and_no_gpu_refusals(
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = tmp_path / "repo"
    reports = tmp_path / "reports"
    _model(repo, "old_gpu", "{ kind: KIND_GPU gpus: [ 1 ] }", reports / "old")
    _model(repo, "any_gpu", "{ kind: KIND_GPU }", reports / "any")
    monkeypatch.setenv(FAKE_GPUS_ENV, FAKE)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = start_server(
        repo, "--min-supported-compute-capability", "8.0", "--allow-gpu-metrics", "false"
    )
    with server.client() as client:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["old_gpu"].state == "UNAVAILABLE"
        assert index["old_gpu"].reason == (  # 2.51: a per-version check (Model::Init)
            "Invalid argument: instance group old_gpu_0 of model old_gpu specifies invalid or "
            "unsupported gpu id 1. GPUs with at least the minimum required CUDA compute "
            "compatibility of 8.000000 are: 0"
        )
        assert client.is_model_ready("any_gpu")
    assert [r["visible"] for r in _reports(reports / "any")] == [UUIDS[0]]
    assert "nv_gpu_" not in _metrics(server)


def test_cpu_host_refuses_kind_gpu_and_runs_kind_auto_on_cpu(
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if discover(env={}).gpus:
        pytest.skip("this host has GPUs")
    repo = tmp_path / "repo"
    reports = tmp_path / "reports"
    _model(repo, "gpu_only", "{ kind: KIND_GPU }", reports / "gpu")
    _model(repo, "auto", "{ kind: KIND_AUTO count: 2 }", reports / "auto")
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    server = start_server(repo)
    with server.client() as client:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["gpu_only"].reason == (  # 2.51: a per-version check (Model::Init)
            "Invalid argument: instance group gpu_only_0 of model gpu_only has kind KIND_GPU but "
            "no GPUs are available"
        )
        assert client.is_model_ready("auto")
    assert [(r["name"], r["kind"]) for r in _reports(reports / "auto")] == [
        ("auto_0_0", "CPU"),
        ("auto_0_1", "CPU"),
    ]
