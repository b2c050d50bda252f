"""tritonserver's command line end to end: ``triton-mp-tritonserver`` (tritonserver's argv
unchanged) refuses what tritonserver refuses with its words, serves with the flags KServe,
Model Analyzer and ModelMesh pass, and ``--strict-readiness``, ``--allow-grpc`` and
``--grpc-use-ssl`` mean what they mean in Triton. Where the real Triton 2.51 is installed
(``.peers/``), the refusals and the readiness sequence run against both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import copy_models, write_python_model
from tests.helpers.server import (
    REPO_ROOT,
    TRITONSERVER,
    ServerProcess,
    free_port,
    wait_for,
)
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BROKEN = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("broken on purpose")

    def execute(self, requests):
        return []
"""
BROKEN_CONFIG = """
name: "broken_py"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
"""


def _ours(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src"))
    return subprocess.run(
        [sys.executable, *TRITONSERVER, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _theirs(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [env["TRITONSERVER"], *argv], capture_output=True, text=True, timeout=60, check=False
    )


def _without_prog(text: str, prog: str) -> str:
    return text.replace(f"{prog}: ", "PROG: ")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--no-such-flag=1"], "PROG: unrecognized option '--no-such-flag=1'"),
        (["--model-repository=/nonexistent", "extra"], "Unexpected argument: extra"),
        (["--grpc-port=abc"], "Invalid option value. Got abc"),
        (["--allow-http=maybe"], "invalid value for bool option: maybe"),
        (["--model-control-mode=sometimes"], "invalid argument for --model-control-mode"),
        (["--grpc-port"], "PROG: option '--grpc-port' requires an argument"),
        (
            ["--allow-metrics=false"],
            "error: creating server: Invalid argument - --model-repository must be specified",
        ),
    ],
)
def test_refusals_match_tritonserver(argv: list[str], line: str) -> None:
    ours = _ours(*argv)
    assert ours.returncode == 1
    assert line in _without_prog(ours.stderr, "tritonserver").splitlines()
    env = peers_env()
    if env is None:
        pytest.skip("the real Triton is not installed (bash bench/peers/install-peers.sh .peers)")
    theirs = _theirs(env, *argv)
    assert theirs.returncode == 1
    assert line in _without_prog(theirs.stderr, env["TRITONSERVER"]).splitlines()


def _infer(client: grpcclient.InferenceServerClient | httpclient.InferenceServerClient) -> None:
    mod = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = mod.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


@pytest.fixture
def add_sub_repo(tmp_path: Path) -> Path:
    return copy_models(tmp_path / "repo", "add_sub")


def test_kserve_serving_runtime_argv(
    start_server: Callable[..., ServerProcess], add_sub_repo: Path
) -> None:
    # KServe's tritonserver ServingRuntime: tritonserver --model-store=/mnt/models
    # --grpc-port=9000 --http-port=8080 --allow-grpc=true --allow-http=true (ports: free ones).
    server = start_server(
        add_sub_repo,
        "--allow-grpc=true",
        "--allow-http=true",
        entry=TRITONSERVER,
        repository_flag="--model-store",
    )
    _infer(server.client())
    _infer(httpclient.InferenceServerClient(server.http_url))
    assert "is accepted but" not in server.log()


def test_model_analyzer_and_modelmesh_argv(
    start_server: Callable[..., ServerProcess], add_sub_repo: Path
) -> None:
    server = start_server(
        add_sub_repo,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--strict-model-config=false",
        "--metrics-interval-ms=1000",
        "--strict-readiness=false",
        "--allow-sagemaker=false",
        "--grpc-keepalive-time=10000",
        "--grpc-keepalive-timeout=5000",
        "--grpc-keepalive-permit-without-calls=true",
        "--grpc-http2-max-pings-without-data=0",
        "--grpc-max-connection-age=600000",
        "--metrics-config=summary_latencies=true",
        entry=TRITONSERVER,
    )
    _infer(server.client())
    log = server.log()
    assert "'--strict-model-config' has been deprecated!" in log
    assert "'--metrics-config=summary_latencies=true' is accepted but not acted on yet" in log
    assert "sagemaker" not in log


def _readiness_sequence(url: str) -> list[tuple[str, bool]]:
    """ServerReady after each step of: start with add_sub_py, unload it, load broken_py
    (which fails)."""
    client = grpcclient.InferenceServerClient(url)
    seen = [("start", client.is_server_ready())]
    client.unload_model("add_sub_py")

    def unloaded() -> bool:
        index = {m.name: m for m in client.get_model_repository_index().models}
        return (index["add_sub_py"].state, index["add_sub_py"].reason) == (
            "UNAVAILABLE",
            "unloaded",
        )

    wait_for(unloaded, 30, "add_sub_py unloaded")
    seen.append(("unloaded", client.is_server_ready()))
    with pytest.raises(InferenceServerException):
        client.load_model("broken_py")
    seen.append(("failed load", client.is_server_ready()))
    client.close()
    return seen


@pytest.fixture
def readiness_repo(tmp_path: Path) -> Path:
    repo = copy_models(tmp_path / "repo", "add_sub_py")
    write_python_model(repo, "broken_py", BROKEN_CONFIG, BROKEN)
    return repo


@pytest.fixture
def triton_factory(tmp_path: Path) -> Iterator[Callable[..., RealTriton]]:
    env = peers_env()
    started: list[RealTriton] = []

    def start(*argv: str) -> RealTriton:
        if env is None:
            pytest.skip("the real Triton is not installed")
        t = RealTriton(env, tmp_path / f"triton{len(started)}.log", *argv)
        started.append(t)
        t.wait_live()
        return t

    yield start
    for t in started:
        t.stop(wait=False)


@pytest.mark.parametrize("strict", [True, False])
def test_strict_readiness_as_triton(
    start_server: Callable[..., ServerProcess],
    triton_factory: Callable[..., RealTriton],
    readiness_repo: Path,
    strict: bool,
) -> None:
    flags = (
        "--model-control-mode=explicit",
        "--load-model=add_sub_py",
        f"--strict-readiness={str(strict).lower()}",
    )
    server = start_server(readiness_repo, *flags, entry=TRITONSERVER, wait=False)
    triton_argv = (f"--model-repository={readiness_repo}", *flags)
    # NOTE: the real Triton (where installed) starts while ours does
    triton = triton_factory(*triton_argv) if peers_env() is not None else None
    server.wait_live()
    ours = _readiness_sequence(server.url)
    # Triton: a model unloaded on request no longer counts; one that failed to load keeps a
    # strict server not ready.
    expected = [("start", True), ("unloaded", True), ("failed load", not strict)]
    assert ours == expected
    if triton is None:
        triton = triton_factory(*triton_argv)  # NOTE: skips: the real Triton is not installed
    theirs = _readiness_sequence(triton.url)
    assert theirs == expected, (theirs, ours)


def test_allow_grpc_false_serves_http_only(
    start_server: Callable[..., ServerProcess], add_sub_repo: Path
) -> None:
    server = start_server(add_sub_repo, "--allow-grpc=false", entry=TRITONSERVER, wait=False)

    def http_ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=1):
                return True
        except OSError:
            return False

    wait_for(http_ready, 120, "HTTP ready")
    _infer(httpclient.InferenceServerClient(server.http_url))
    client = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=2)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_grpc_use_ssl_serves_tls(
    start_server: Callable[..., ServerProcess], add_sub_repo: Path, tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    server = start_server(
        add_sub_repo,
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={cert}",
        f"--grpc-server-key={key}",
        entry=TRITONSERVER,
        wait=False,
    )
    tls = grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(cert))

    def live() -> bool:
        try:
            return bool(tls.is_server_live(client_timeout=2))
        except InferenceServerException:
            return False

    wait_for(live, 120, "TLS ServerLive")
    _infer(tls)
    plain = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=2)


def _serve_args(repo: Path) -> list[str]:
    return [
        f"--model-repository={repo}",
        "--http-address=127.0.0.1",
        f"--http-port={free_port()}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={free_port()}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={free_port()}",
    ]


@pytest.mark.parametrize("flag", [(), ("--exit-on-error=true",)])
def test_exit_on_error_stops_a_server_whose_model_failed(
    readiness_repo: Path, flag: tuple[str, ...]
) -> None:
    """tritonserver's default (and ``--exit-on-error=true``): a model that fails to load at
    start stops the server, after the others unload, with status 1 and its words."""
    with _triton_beside(readiness_repo, *flag):
        ours = _ours(*_serve_args(readiness_repo), *flag)
        assert ours.returncode == 1, ours.stderr[-2000:]
        assert "creating server: Internal - failed to load all models" in ours.stderr


@contextmanager
def _triton_beside(repo: Path, *flags: str) -> Iterator[None]:
    """The real tritonserver (when installed) on ``repo`` with ``flags``, run beside the
    block (each start is seconds of a 2-core machine), must exit 1 with its "failed to load
    all models" once the block is done; killed if the block fails."""
    env = peers_env()
    if env is None:
        yield
        return
    with tempfile.TemporaryFile("w+") as log:
        theirs = subprocess.Popen(
            [env["TRITONSERVER"], f"--backend-directory={env['TRITON_BACKENDS']}"]
            + _serve_args(repo)
            + list(flags),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            env=dict(os.environ, PATH=f"{env['TRITON_STUB_ENV']}/bin:{os.environ['PATH']}"),
        )
        try:
            yield
            theirs.wait(timeout=120)
        finally:
            if theirs.poll() is None:
                theirs.kill()
                theirs.wait()
        log.seek(0)
        stderr = log.read()
    assert theirs.returncode == 1
    assert "error: creating server: Internal - failed to load all models" in stderr


@pytest.mark.parametrize(("entry", "flag"), [(TRITONSERVER, "--exit-on-error=false"), (None, None)])
def test_without_exit_on_error_the_other_models_serve(
    start_server: Callable[..., ServerProcess],
    readiness_repo: Path,
    entry: tuple[str, ...] | None,
    flag: str | None,
) -> None:
    """``--exit-on-error=false`` (and ``triton-mp start``'s default): the failed model is
    listed UNAVAILABLE and the others serve."""
    kwargs = {"entry": entry} if entry is not None else {}
    server = start_server(readiness_repo, *([flag] if flag else []), **kwargs)
    client = grpcclient.InferenceServerClient(server.url)
    try:
        assert client.is_model_ready("add_sub_py")
        assert not client.is_model_ready("broken_py")
    finally:
        client.close()


def test_exit_on_error_counts_a_load_model_the_repository_lacks(readiness_repo: Path) -> None:
    """``--load-model=nosuch`` in explicit mode: tritonserver exits 1 as for a failed load
    (found by a new-user check; triton-mp kept serving 0 models)."""
    argv = ["--model-control-mode=explicit", "--load-model=nosuch"]
    with _triton_beside(readiness_repo, *argv):
        ours = _ours(*_serve_args(readiness_repo), *argv)
        assert ours.returncode == 1, ours.stderr[-2000:]
        assert "creating server: Internal - failed to load all models" in ours.stderr
