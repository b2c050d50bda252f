"""What deploy/ relies on, against running servers (issue 22, docs/deploy.md):

- the image's own commands, read from the Dockerfile, build a wheel that serves the default
  repository, materialised by the Dockerfile's asset command and then made read-only, with
  the image's CMD, the HEALTHCHECK's own probe, and a /dev/shm footprint well inside the
  Deployment's emptyDir;
- the drain contract with the Deployment's own arguments and numbers: on SIGTERM the server
  turns not ready before it stops taking requests, answers everything accepted, and exits
  within the grace period less the preStop sleep;
- every metric prometheus-adapter's rules read is served, and the HPA's queue-time formula
  computes from it;
- KServe's ServingRuntime argv starts triton-mp's tritonserver-compatible entry point.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.deploy.dockerfile import ROOT, exec_form, stage, stages
from tests.deploy.manifests import DEPLOY, by_kind, flag_value, load, render
from tests.helpers.repos import write_python_model
from tests.helpers.server import (
    STARTED_PIDS,
    ServerProcess,
    counted,
    free_port,
    group_alive,
    wait_for,
)
from triton_mp.ipc.memory.shm import DEV_SHM, list_objects, remove_entry

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ADAPTER_METRIC = re.compile(r"seriesQuery: '(\w+)\{")


def _deployment_container() -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = by_kind(render(DEPLOY / "kubernetes/base"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _without(args: list[str], *flags: str) -> list[str]:
    """``args`` less every ``--flag=value`` of ``flags`` (the test gives its own)."""
    return [a for a in args if a.split("=", 1)[0] not in flags]


def _ready(http_port: int) -> int:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _run(command: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    out = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, f"{command}\n{out.stdout}\n{out.stderr}"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of a server's process group and remove its shared memory."""
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not group_alive(proc.pid), 10, "the server's group to exit")
    for name in list_objects(str(proc.pid)):
        remove_entry(name)


def _shm_bytes(server_id: str) -> int:
    return sum((DEV_SHM / name).stat().st_size for name in list_objects(server_id))


def _materialised(directory: str, names: list[str]) -> set[str]:
    """The files ``triton-mp start`` may have materialised into the checkout (.dockerignore
    keeps them out of the image, so the image's asset step must write them itself)."""
    d = Path(directory)
    return {
        n
        for n in names
        if (n == "model.onnx" and d.parent.name.startswith("ocr_"))
        or (n == "silero_vad.onnx" and d.parent.name == "silero_vad")
        or (n == "ppocr_keys.txt" and d.parent.name == "ocr_rec_bls")
    }


def _image_commands(tmp: Path) -> dict[str, str]:
    """The venv stage's wheel, install and asset commands, with the image's paths mapped
    into ``tmp`` and its venv's pip and python mapped to this interpreter. The install goes
    to a ``--target`` directory (its dependencies are this environment's)."""
    py = shlex.quote(sys.executable)
    mapping = {
        "/opt/triton-mp/bin/pip": f"{py} -m pip",
        "/opt/triton-mp/bin/python": py,
        "/wheels": str(tmp / "wheels"),
        "/models": str(tmp / "models"),
    }
    commands = {}
    for command in stage("venv").commands():
        for old, new in mapping.items():
            command = command.replace(old, new)
        if " wheel " in command:
            commands["wheel"] = command
        elif "triton_mp-*.whl" in command:
            commands["install"] = command.replace(
                " install ", f" install --no-deps --target {tmp / 'site'} "
            ).replace("[${EXTRAS}]", "")
        elif "triton_mp.cli.assets" in command:
            commands["assets"] = command
    assert set(commands) == {"wheel", "install", "assets"}, commands
    return commands


def test_the_image_commands_serve_the_default_repository_read_only(tmp_path: Path) -> None:
    context = tmp_path / "src"  # the Dockerfile's COPY lines
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, context / name)
    shutil.copytree(ROOT / "src", context / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "model_repository",
        tmp_path / "models",
        ignore=_materialised,
    )
    commands = _image_commands(tmp_path)
    _run(commands["wheel"], context)
    (wheel,) = (tmp_path / "wheels").glob("triton_mp-*.whl")
    _run(commands["install"], tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "PYTHONDONTWRITEBYTECODE": "1"}
    _run(commands["assets"], tmp_path, env)
    assert (tmp_path / "models/ocr_cls/1/model.onnx").exists()
    for path in [tmp_path / "models", *(tmp_path / "models").rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    where = subprocess.run(
        [sys.executable, "-c", "import triton_mp; print(triton_mp.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(tmp_path / "site")), "the wheel's code, not the checkout's"

    runtime = stages()[-1]
    cmd_args = [
        a.replace("/models", str(tmp_path / "models")) for a in exec_form(runtime.values("CMD")[0])
    ]
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        str(tmp_path / "site/bin/triton-mp"),
        *exec_form(runtime.values("ENTRYPOINT")[0])[1:],
        *cmd_args,
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
    ]
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    STARTED_PIDS.add(proc.pid)
    health = " ".join(exec_form(runtime.values("HEALTHCHECK")[0].split("CMD", 1)[1].strip())[2:])
    probe = [sys.executable, "-c", health.replace(":8000/", f":{http_port}/")]
    try:
        deadline = time.monotonic() + 480  # the whole default repository, on a loaded machine
        while subprocess.run(probe, capture_output=True, check=False).returncode != 0:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(1)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        a = np.arange(16, dtype=np.float32)[None]
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        assert (client.infer("add_sub", inputs).as_numpy("OUTPUT0") == 2 * a).all()
        client.close()
        _, container = _deployment_container()
        (dshm,) = [
            v
            for v in by_kind(render(DEPLOY / "kubernetes/base"), "Deployment")[0]["spec"][
                "template"
            ]["spec"]["volumes"]
            if v["name"] == "dshm"
        ]
        limit = int(dshm["emptyDir"]["sizeLimit"].removesuffix("Gi")) << 30
        used = _shm_bytes(str(proc.pid))
        assert 0 < used < limit // 16, f"{used} bytes of /dev/shm idle, limit {limit}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "server.log").read_text()
    finally:
        _kill(proc)
        log.close()
    assert wheel.name.startswith("triton_mp-0.")


SLOW_MODEL = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(2.0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
"""
SLOW_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
    output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
    instance_group [{ kind: KIND_CPU, count: 1 }]
"""


def test_sigterm_drain_with_the_deployment_numbers(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    deployment, container = _deployment_container()
    args = _without(
        container["args"], "--model-repository", "--http-port", "--grpc-port", "--metrics-port"
    )
    exit_timeout = int(flag_value(args, "--exit-timeout-secs") or 30)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    write_python_model(tmp_path / "repo", "slow", SLOW_CONFIG, SLOW_MODEL)
    server = start_server(tmp_path / "repo", *args, "--log-verbose=1")
    http_port = int(server.http_url.rsplit(":", 1)[1])
    assert _ready(http_port) == 200

    def infer(k: int) -> tuple[int, float]:
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        i = httpclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([k], np.int32))
        out = int(c.infer("slow", [i]).as_numpy("OUT")[0])
        c.close()
        return out, time.monotonic()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(infer, k) for k in range(4)]
        wait_for(lambda: server.log().count("accepted for 'slow'") == 4, 60, "4 requests accepted")
        t_term = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _ready(http_port) != 200, 5, "readiness to turn false")
        t_not_ready = time.monotonic()
        late = httpclient.InferenceServerClient(server.http_url)
        i = httpclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([9], np.int32))
        with pytest.raises(InferenceServerException, match="Server is stopping"):
            late.infer("slow", [i])
        late.close()
        results = [f.result(timeout=exit_timeout) for f in futures]
    assert sorted(r for r, _ in results) == [0, 1, 2, 3], "every accepted request answered"
    assert t_not_ready < min(t for _, t in results), "not ready before the last answers left"
    assert server.proc.wait(timeout=exit_timeout) == 0
    assert time.monotonic() - t_term < grace - pre_stop


def test_the_metrics_the_autoscaler_reads_are_served(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    (config_map,) = load(DEPLOY / "kubernetes/monitoring/prometheus-adapter-rules.yaml")
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    wanted = {ADAPTER_METRIC.match("seriesQuery: '" + r["seriesQuery"]).group(1) for r in rules}
    assert "nv_inference_queue_duration_us" in wanted
    write_python_model(tmp_path / "repo", "slow", SLOW_CONFIG, SLOW_MODEL.replace("2.0", "0.05"))
    server = start_server(tmp_path / "repo")
    c = httpclient.InferenceServerClient(server.http_url)
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([1], np.int32))
    for _ in range(3):
        c.infer("slow", [i])
    c.close()

    def scrape() -> tuple[str, dict[str, float]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
            text = r.read().decode()
        samples = {}
        for line in text.splitlines():
            m = re.match(r'(\w+)\{model="slow",version="1"\} (\S+)', line)
            if m:
                samples[m.group(1)] = float(m.group(2))
        return text, samples

    text, samples = counted(
        scrape, lambda got: got[1].get("nv_inference_request_success", 0) >= 3, "3 successes"
    )
    served = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if not ln.startswith("#")}
    assert wanted <= served
    assert samples["nv_inference_request_success"] == 3
    queue_per_request = (
        samples["nv_inference_queue_duration_us"] / samples["nv_inference_request_success"]
    )
    assert 0 <= queue_per_request < 1e6


def test_kserve_runtime_argv_starts_the_tritonserver_entry_point(tmp_path: Path) -> None:
    (runtime,) = load(DEPLOY / "kserve/clusterservingruntime.yaml")
    (container,) = runtime["spec"]["containers"]
    (command,) = container["command"]
    script = Path(sys.executable).with_name(command)
    if not script.exists():
        pytest.fail(f"{command} is not installed beside {sys.executable}: pip install -e .")
    write_python_model(tmp_path / "models", "slow", SLOW_CONFIG, SLOW_MODEL.replace("2.0", "0"))
    http_port, grpc_port = free_port(), free_port()
    argv = [
        a.replace("/mnt/models", str(tmp_path / "models"))
        .replace("--grpc-port=9000", f"--grpc-port={grpc_port}")
        .replace("--http-port=8080", f"--http-port={http_port}")
        for a in container["args"]
    ]
    metrics = runtime["spec"]["annotations"]["prometheus.kserve.io/port"]
    argv.append(f"--metrics-port={free_port()}")
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [str(script), *argv],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    STARTED_PIDS.add(proc.pid)
    try:
        wait_for(lambda: _ready(http_port) == 200 or proc.poll() is not None, 120, "ready")
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        assert metrics == "8002", "KServe scrapes triton-mp's default metrics port"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        _kill(proc)
        log.close()
