"""Model control modes end to end with tritonclient: explicit load / unload / reload of ONNX
and python models, config and file overrides, a new version under load, a broken version,
poll mode, and none mode's refusal.

Each test copies models of the project's repository into a tmp repository it may change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import ServerProcess, wait_for
from triton_mp.ipc.memory.shm import list_objects
from triton_mp.ipc.memory.topology import Topology

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"


def _inputs(batch: int = 1, mod: object = grpcclient) -> list[grpcclient.InferInput]:
    a = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)
    out = []
    for name in ("INPUT0", "INPUT1"):
        i = mod.InferInput(name, [batch, 16], "FP32")  # type: ignore[attr-defined]
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def _infer(client: grpcclient.InferenceServerClient, model: str, version: str = "") -> str:
    """Infer once; checks OUTPUT0 = INPUT0 + INPUT1 and returns the version that answered."""
    result = client.infer(model, _inputs(), model_version=version)
    expected = 2 * np.arange(16, dtype=np.float32).reshape(1, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    return str(result.get_response().model_version)


def _index(client: grpcclient.InferenceServerClient) -> dict[tuple[str, str], tuple[str, str]]:
    return {
        (m.name, m.version): (m.state, m.reason) for m in client.get_model_repository_index().models
    }


def _worker_processes(server: ServerProcess) -> list[str]:
    """The process titles of the server's workers (``triton-mp: worker <instance>``)."""
    out = subprocess.run(
        ["ps", "-o", "args=", "-g", str(server.pid)], capture_output=True, text=True, check=False
    ).stdout
    return [line for line in out.splitlines() if line.startswith("triton-mp: worker")]


def _instance_objects(server: ServerProcess) -> list[str]:
    """/dev/shm entries of model instances (rings, semaphores, output arenas, BLS rings)."""
    top = Topology(str(server.pid))
    return [
        n
        for n in list_objects(str(server.pid))
        if (obj := top.parse(n)) is not None and obj.instances
    ]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_models(tmp_path / "repo", "add_sub", "add_sub_py")


def test_none_mode_refuses_load_and_unload(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(repo)
    client = server.client()
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as e:
            call("add_sub")
        assert e.value.message() == CONTROL_DISABLED
        assert e.value.status() == "StatusCode.UNAVAILABLE"
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match=CONTROL_DISABLED):
        http.load_model("add_sub")
    assert _infer(client, "add_sub") == "1"


def test_explicit_load_unload_reload_leaves_nothing_behind(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(repo, "--model-control-mode=explicit")
    client = server.client()
    http = httpclient.InferenceServerClient(server.http_url)
    # NOTE: nothing loaded at start: the index lists the repository's models by name only.
    assert _index(client) == {("add_sub", ""): ("", ""), ("add_sub_py", ""): ("", "")}
    assert not client.is_model_ready("add_sub")
    assert client.is_server_ready()
    assert not _worker_processes(server)

    client.load_model("add_sub")
    http.load_model("add_sub_py")
    assert _infer(client, "add_sub") == "1"
    assert _infer(client, "add_sub_py") == "1"
    assert _index(client) == {
        ("add_sub", "1"): ("READY", ""),
        ("add_sub_py", "1"): ("READY", ""),
    }
    assert len(_worker_processes(server)) == 2
    assert http.get_model_repository_index() == [
        {"name": "add_sub", "version": "1", "state": "READY"},
        {"name": "add_sub_py", "version": "1", "state": "READY"},
    ]

    # A load with nothing changed on disk does nothing (the python model's __pycache__
    # written by its worker does not count).
    started = server.log().count("started worker")
    client.load_model("add_sub_py")
    client.load_model("add_sub")
    assert server.log().count("started worker") == started

    client.unload_model("add_sub")
    http.unload_model("add_sub_py")
    unloaded = {
        ("add_sub", "1"): ("UNAVAILABLE", "unloaded"),  # each version it served, as Triton
        ("add_sub_py", "1"): ("UNAVAILABLE", "unloaded"),
    }
    # NOTE: an unload answers at once; the versions are UNLOADING until their workers exit.
    wait_for(lambda: _index(client) == unloaded, 30, "both models UNAVAILABLE")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'add_sub'"):
        _infer(client, "add_sub")
    assert not client.is_model_ready("add_sub_py")
    assert client.is_server_ready()
    wait_for(lambda: not _worker_processes(server), 30, "the workers to exit")
    assert not _instance_objects(server), _instance_objects(server)

    # Loaded again after an unload: new instances serve.
    client.load_model("add_sub_py")
    assert _infer(client, "add_sub_py") == "1"
    assert len(_worker_processes(server)) == 1


def test_load_unknown_model_and_bad_parameters(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    client = server.client()
    with pytest.raises(InferenceServerException) as e:
        client.load_model("no_such_model")
    assert e.value.message() == (
        "failed to load 'no_such_model', failed to poll from model repository"
    )
    assert e.value.status() == "StatusCode.INTERNAL"
    # Triton's poll fails on a config override that does not parse (the log has why)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_sub", config="{not json")
    assert (e.value.status(), e.value.message()) == (
        "StatusCode.INTERNAL",
        "failed to load 'add_sub', failed to poll from model repository",
    )
    # A model name is a directory entry of the repository, never a path out of it.
    outside = repo.parent / "outside"
    copy_models(outside, "add_sub_py")
    # core ValidateModelName (upstream main, 2026) refuses '..' and '/' first.
    for name in ("../outside/add_sub_py", str(outside / "add_sub_py"), ".."):
        with pytest.raises(InferenceServerException) as e:
            client.load_model(name)
        assert e.value.message() == (
            f"invalid model name '{name}', model name must not contain path traversal characters"
        )
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as e:
        client.load_model(".hidden")
    assert e.value.message() == "failed to load '.hidden', failed to poll from model repository"
    assert e.value.status() == "StatusCode.INTERNAL"
    listed = {m.name for m in client.get_model_repository_index().models}
    assert listed == {"add_sub", "add_sub_py"}
    assert _infer(client, "add_sub") == "1"


def test_config_override_and_files(repo: Path, start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    client = server.client()
    config = client.get_model_config("add_sub", as_json=True)["config"]
    assert config["max_batch_size"] == 8

    # The config parameter replaces config.pbtxt: max_batch_size 2, two instances.
    override = dict(config, max_batch_size=2)
    override["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    override["dynamic_batching"] = {}
    client.load_model("add_sub", config=json.dumps(override))
    new = client.get_model_config("add_sub", as_json=True)["config"]
    assert new["max_batch_size"] == 2
    assert new["instance_group"][0]["count"] == 2
    with pytest.raises(InferenceServerException, match="batch-size must be <= 2"):
        client.infer("add_sub", _inputs(batch=3))
    assert _infer(client, "add_sub") == "1"
    wait_for(lambda: len(_worker_processes(server)) == 2, 30, "the old instance to stop")

    # files= brings a model that is not in the repository at all.
    onnx = (repo / "add_sub" / "1" / "model.onnx").read_bytes()
    copy = dict(config, name="add_sub_upload")
    http = httpclient.InferenceServerClient(server.http_url)
    http.load_model("add_sub_upload", config=json.dumps(copy), files={"file:1/model.onnx": onnx})
    assert _infer(client, "add_sub_upload") == "1"
    client.load_model("add_sub_upload", config=json.dumps(copy), files={"file:3/model.onnx": onnx})
    wait_for(lambda: client.is_model_ready("add_sub_upload", "3"), 30, "version 3 of the upload")
    # NOTE: a model brought by files= alone has no directory in the repository: 2.51's
    # RepositoryIndex leaves it out (d5b28f24, r13's F4)
    assert not any(name == "add_sub_upload" for name, _ in _index(client))
    assert _infer(client, "add_sub_upload") == "3"
    client.unload_model("add_sub_upload")
    client.unload_model("add_sub")
    wait_for(lambda: not _worker_processes(server), 30, "the workers to exit")
    # NOTE: the unloads answered before their drain; it frees the objects after the exits.
    wait_for(lambda: not _instance_objects(server), 30, "the instances' objects to go")


def test_new_version_under_load_fails_no_request(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    errors: list[str] = []
    versions: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        client = server.client()
        try:
            while not stop.is_set():
                try:
                    versions.append(_infer(client, "add_sub"))
                except Exception as e:  # noqa: BLE001 - every failure is the test's finding
                    errors.append(str(e))
        finally:
            client.close()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(versions) > 50, 60, "requests to version 1")
        shutil.copytree(repo / "add_sub" / "1", repo / "add_sub" / "2")
        control = server.client()
        control.load_model("add_sub")
        n_after_load = len(versions)
        wait_for(lambda: len(versions) > n_after_load + 50, 60, "requests after the reload")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors[:5]
    assert versions[0] == "1"
    assert versions[-1] == "2"
    assert set(versions) == {"1", "2"}
    index = _index(control)
    assert index[("add_sub", "2")] == ("READY", "")
    assert index[("add_sub", "1")] == ("UNAVAILABLE", "unloaded")  # as Triton lists it
    wait_for(lambda: len(_worker_processes(server)) == 1, 30, "version 1's instance to stop")


def test_broken_new_version_keeps_the_old_one_serving(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    client = server.client()
    (repo / "add_sub" / "2").mkdir()
    (repo / "add_sub" / "2" / "model.onnx").write_bytes(b"this is not an onnx model")
    # NOTE: auto-complete reads the newest version's graph, so the reload fails there.
    with pytest.raises(InferenceServerException, match="failed to read ONNX model"):
        client.load_model("add_sub")
    assert _infer(client, "add_sub") == "1"
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")
    index = _index(client)
    assert index[("add_sub", "1")] == ("READY", "")
    state, reason = index[("add_sub", "2")]
    assert state == "UNAVAILABLE"
    assert reason
    assert "failed to load model 'add_sub'" in server.log()
    with pytest.raises(InferenceServerException, match="version 2 is not at ready state"):
        _infer(client, "add_sub", "2")
    # Fixed on disk: the next load serves version 2.
    shutil.copy(repo / "add_sub" / "1" / "model.onnx", repo / "add_sub" / "2" / "model.onnx")
    client.load_model("add_sub")
    assert _infer(client, "add_sub") == "2"


def test_version_that_fails_in_its_worker_keeps_the_old_one_serving(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """Without auto-complete the config loads and version 2's instance fails to start."""
    server = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--disable-auto-complete-config",
    )
    client = server.client()
    (repo / "add_sub" / "2").mkdir()
    (repo / "add_sub" / "2" / "model.onnx").write_bytes(b"this is not an onnx model")
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_sub")
    assert e.value.message().startswith(
        "load failed for model 'add_sub': version 2 is at UNAVAILABLE state: "
    )
    assert e.value.message().endswith(";\n")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"  # Triton's INVALID_ARG
    assert _infer(client, "add_sub") == "1"
    assert not client.is_model_ready("add_sub", "2")
    assert _index(client)[("add_sub", "2")][0] == "UNAVAILABLE"
    assert "failed to load model 'add_sub' version 2" in server.log()
    wait_for(lambda: len(_worker_processes(server)) == 1, 30, "the failed instance to go")


def test_poll_mode_picks_up_changes(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=0.5")
    client = server.client()
    assert client.get_model_config("add_sub").config.max_batch_size == 8
    with pytest.raises(InferenceServerException, match=CONTROL_DISABLED):
        client.load_model("add_sub")

    cfg = repo / "add_sub" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
    wait_for(
        lambda: client.get_model_config("add_sub").config.max_batch_size == 4,
        60,
        "the edited config to be served",
    )
    assert _infer(client, "add_sub") == "1"

    # A comment changes the file but not the effective config: no new instance.
    started = server.log().count("started worker")
    cfg.write_text("# a comment\n" + cfg.read_text())
    shutil.copytree(PROJECT_ADD_SUB_PY, repo / "add_sub_py")
    wait_for(lambda: client.is_model_ready("add_sub_py"), 60, "the added model")
    assert server.log().count("started worker") == started + 1
    assert _infer(client, "add_sub_py") == "1"

    shutil.rmtree(repo / "add_sub_py")
    wait_for(lambda: not client.is_model_ready("add_sub_py"), 60, "the removed model")
    wait_for(lambda: len(_worker_processes(server)) == 1, 30, "its worker to exit")


PROJECT_ADD_SUB_PY = Path(__file__).resolve().parents[2] / "model_repository" / "add_sub_py"


SLOW_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = "GATE_PATH"


class TritonPythonModel:
    def initialize(self, args):
        # NOTE: loading until the test opens the gate (creates the file), at most 30 s
        deadline = time.monotonic() + 30
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.02)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def test_a_model_being_loaded_is_listed_as_loading(
    repo: Path, start_server: Callable[..., ServerProcess]
) -> None:
    gate = repo.parent / "gate"
    write_python_model(
        repo,
        "slow_py",
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [2] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [2] }]\n',
        SLOW_MODEL.replace("GATE_PATH", str(gate)),
    )
    server = start_server(repo, "--model-control-mode=explicit")
    client = server.client()
    assert _index(client)[("slow_py", "")] == ("", "")
    loader = threading.Thread(target=client.load_model, args=("slow_py",))
    loader.start()
    try:
        wait_for(
            lambda: _index(client).get(("slow_py", ""), ("", ""))[0] == "LOADING",
            10,
            "slow_py to be LOADING",
        )
        assert not client.is_model_ready("slow_py")
    finally:
        gate.touch()
        loader.join(60)
    assert _index(client)[("slow_py", "1")][0] == "READY"
    x = grpcclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([1.5, 2.5], np.float32))
    np.testing.assert_array_equal(
        client.infer("slow_py", [x]).as_numpy("OUTPUT0"), np.array([1.5, 2.5], np.float32)
    )
