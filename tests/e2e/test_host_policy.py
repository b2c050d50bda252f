"""End to end: host policies, onnxruntime optimization settings and priority on real workers.

``--host-policy`` pins each instance's worker process (every thread of it) to its policy's
cores and binds its memory to the policy's NUMA node, which ``/proc/<pid>/status`` and
``/proc/<pid>/numa_maps`` show; onnxruntime's intra-op pool follows the cores given;
``optimization.priority: PRIORITY_MIN`` is nice 19 in ``/proc/<pid>/stat``; an execution
accelerator this host lacks fails that model's load with a clear message while the others
serve. Models are loaded through tritonclient in explicit mode.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import PROJECT_REPOSITORY, REPO_ROOT, ServerProcess, server_factory

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < 2 or not Path("/proc/self/status").exists(),
        reason="needs Linux and two usable CPUs",
    ),
]

CORES = sorted(os.sched_getaffinity(0))
FIRST, SECOND = CORES[0], CORES[1]

ADD_SUB = (PROJECT_REPOSITORY / "add_sub" / "config.pbtxt").read_text()

PY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU host_policy: "nobody_set_this" } ]
optimization { priority: PRIORITY_MIN }
metric_tags { key: "team" value: "search" }
"""
PY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""


def _onnx(repo: Path, name: str, extra: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    shutil.copy(PROJECT_REPOSITORY / "add_sub" / "1" / "model.onnx", d / "1" / "model.onnx")
    text = ADD_SUB.replace('name: "add_sub"', f'name: "{name}"')
    text = re.sub(r"instance_group \[.*?\]\n", "", text, flags=re.S)
    (d / "config.pbtxt").write_text(text + extra)


def _repository(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    group = 'instance_group [ {{ count: 1 kind: KIND_CPU host_policy: "{}" }} ]\n'
    _onnx(repo, "pinned_one", group.format("one"))
    _onnx(
        repo,
        "pinned_two",
        group.format("two")
        + "optimization { graph { level: 2 } }\n"
        + 'parameters [ { key: "enable_mem_arena" value: { string_value: "false" } } ]\n',
    )
    _onnx(repo, "default_cpu", "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    _onnx(
        repo,
        "wants_tensorrt",
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        "optimization { execution_accelerators { "
        'gpu_execution_accelerator [ { name: "tensorrt" } ] } }\n',
    )
    write_python_model(repo, "low_priority", PY_CONFIG, PY_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = _repository(tmp_path_factory.mktemp("host_policy"))
    flags = [
        "--model-control-mode",
        "explicit",
        "--log-verbose",
        "1",
        "--host-policy",
        f"one,cpu-cores={SECOND}-{SECOND}",
        "--host-policy",
        f"two,cpu-cores={FIRST}-{FIRST},{SECOND}",
        "--host-policy",
        "two,numa-node=0",
        "--host-policy",
        f"cpu,cpu-cores={FIRST}-{FIRST}",
    ]
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo, *flags)


def _worker_pid(server: ServerProcess, instance: str) -> int:
    for child in psutil.Process(server.pid).children():
        if child.cmdline()[:1] == [f"triton-mp: worker {instance}"]:
            return child.pid
    raise AssertionError(f"no worker process {instance}")


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return value.strip()
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _threads_allowed(pid: int) -> set[str]:
    """Cpus_allowed_list of every thread of the process."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.add(line.split(":", 1)[1].strip())
    return out


def _infer(client: grpcclient.InferenceServerClient, model: str) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    out = client.infer(model, inputs).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, a * 2)


def test_workers_are_pinned_by_their_host_policy(server: ServerProcess) -> None:
    client = server.client()
    try:
        for model in ("pinned_one", "pinned_two", "default_cpu", "low_priority"):
            client.load_model(model)
        for model in ("pinned_one", "pinned_two", "default_cpu"):
            _infer(client, model)
        one = _worker_pid(server, "pinned_one_0_0")
        two = _worker_pid(server, "pinned_two_0_0")
        default = _worker_pid(server, "default_cpu_0_0")
        low = _worker_pid(server, "low_priority_0_0")
        assert _status(one, "Cpus_allowed_list") == str(SECOND)
        assert _threads_allowed(one) == {str(SECOND)}
        both = f"{FIRST}-{SECOND}" if SECOND == FIRST + 1 else f"{FIRST},{SECOND}"
        assert _status(two, "Cpus_allowed_list") == both
        assert _threads_allowed(two) == {both}
        assert _status(default, "Cpus_allowed_list") == str(FIRST)
        # NOTE: a policy no flag names pins nothing: the worker keeps the server's CPUs.
        assert _status(low, "Cpus_allowed_list") == _status(server.pid, "Cpus_allowed_list")
        # numa-node=0 binds the worker's memory (MPOL_BIND shows as "bind:0").
        numa = Path(f"/proc/{two}/numa_maps")
        if numa.exists() and Path("/sys/devices/system/node/node0").exists():
            assert "bind:0" in numa.read_text()
            assert "bind:" not in Path(f"/proc/{one}/numa_maps").read_text()
        # optimization.priority PRIORITY_MIN -> nice 19 (field 19 of /proc/<pid>/stat).
        assert psutil.Process(low).nice() == 19
        assert psutil.Process(one).nice() == psutil.Process(server.pid).nice()
        log = server.log()
        # onnxruntime's intra-op pool follows the cores given (unpinned: one less than the
        # usable cores, so 1 on a 2-core host).
        assert "(2 intra-op threads, graph ORT_DISABLE_ALL)" in log
        # A field triton-mp does not act on is named in a warning when the model loads.
        assert (
            """model 'low_priority': metric_tags {"team": "search"}: not added to metrics""" in log
        )
    finally:
        client.close()


def test_an_accelerator_this_host_lacks_fails_only_that_model(server: ServerProcess) -> None:
    client = server.client()
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("wants_tensorrt")
        message = info.value.message()
        assert "requests the 'tensorrt' execution accelerator" in message
        assert "no TensorrtExecutionProvider" in message
        assert not client.is_model_ready("wants_tensorrt")
        client.load_model("default_cpu")
        _infer(client, "default_cpu")
    finally:
        client.close()


def test_an_unknown_host_policy_setting_stops_the_server(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "triton_mp", "start", "--model-repository", str(tmp_path / "repo")]
        + ["--host-policy", "cpu,pinned-memory=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert (
        "Unsupported host policy setting 'pinned-memory' is specified, supported settings are "
        "'numa-node', 'cpu-cores'"
    ) in done.stdout + done.stderr
