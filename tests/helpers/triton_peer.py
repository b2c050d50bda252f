"""The real Triton 2.51 and perf_analyzer (``.peers/``) for side-by-side tests (not a test module).

One place reads ``peers.env`` (``peers_env``, or ``require_peers`` to skip without it) and
one class runs ``tritonserver`` with any flags on free ports (``RealTriton``, stopped by PID).
``start_triton`` starts one on a repository and waits until it is ready, skipping the
calling test when the peers are not installed (``bash bench/peers/install-peers.sh .peers``)
or Triton does not come up. ``side_by_side`` starts triton-mp and the real Triton on one
repository; ``serve_models`` writes that repository from python models first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

from tests.helpers.repos import IDENTITY_PY, write_python_model
from tests.helpers.server import LIVE_POLL_S, REPO_ROOT, ServerProcess, free_port, wait_grpc_live

PEERS_ENV = Path(os.environ.get("PEERS_ENV", REPO_ROOT / ".peers" / "peers.env"))
"""The env file ``bench/peers/install-peers.sh`` writes (the real Triton 2.51)."""

_INSTALL = "run: bash bench/peers/install-peers.sh .peers"

STUB_REGIONS = f"triton_python_backend_shm_region_t{os.getpid()}_"
"""The start of the name of every /dev/shm region the python backend of a real Triton this
test process starts creates (one per model instance, then the region's uuid): each
``RealTriton`` names its own prefix under it (``region_prefix``, given as the python
backend's ``shm-region-prefix-name``), so its regions can be told from another test run's
and removed once it exited, however it ended. It starts with 2.51's default prefix, which
both servers reserve (a client cannot register a key that starts with it)."""

_NEXT_PEER = itertools.count()


def left_regions(prefix: str = STUB_REGIONS) -> list[Path]:
    """The /dev/shm regions whose names start with ``prefix``."""
    return sorted(Path("/dev/shm").glob(f"{prefix}*"))


def _sourced() -> dict[str, str] | None:
    if not PEERS_ENV.exists():
        return None
    out = subprocess.run(
        ["bash", "-c", f'. "{PEERS_ENV}" && env -0'], capture_output=True, check=True
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def peers_env() -> dict[str, str] | None:
    """The environment after sourcing ``peers.env`` (``TRITONSERVER``, ``TRITON_BACKENDS``,
    ``TRITON_STUB_ENV``, ``PERF_ANALYZER``, and its ``LD_LIBRARY_PATH``/``PYTHONPATH``), or
    None when the peers are not installed or lack the tritonserver binary."""
    env = _sourced()
    if env is None or not Path(env.get("TRITONSERVER", "")).exists():
        return None
    return env


def require_peers(binary: str = "TRITONSERVER") -> dict[str, str]:
    """The sourced ``peers.env`` when it names an existing ``binary`` (``TRITONSERVER`` or
    ``PERF_ANALYZER``); otherwise the calling test is skipped."""
    env = _sourced()
    if env is None:
        pytest.skip(f"the peers are not installed ({_INSTALL})")
    if not Path(env.get(binary, "")).exists():
        pytest.skip(f"the peers folder has no {binary} ({_INSTALL})")
    return env


class RealTriton:
    """The real ``tritonserver`` on 127.0.0.1 with free ports; stopped by PID. ``argv`` are
    tritonserver flags beyond the ports and the backend directory.

    Attributes:
        url, http_url: gRPC and HTTP ``host:port``, as ``ServerProcess``'s.
        metrics_port: its Prometheus port.
    """

    def __init__(self, env: dict[str, str], log_path: Path, *argv: str) -> None:
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.url = f"127.0.0.1:{self.grpc_port}"
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.log_path = log_path
        self.region_prefix = f"{STUB_REGIONS}{next(_NEXT_PEER)}_"
        """The start of this server's python-backend regions' names (``stop`` removes them)."""
        # NOTE: the stub's env first on PATH: the python models' interpreter finds numpy there.
        run_env = {**os.environ, **env}
        run_env["PATH"] = f"{env['TRITON_STUB_ENV']}/bin:{os.environ.get('PATH', '')}"
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    env["TRITONSERVER"],
                    f"--backend-directory={env['TRITON_BACKENDS']}",
                    "--http-address=127.0.0.1",
                    f"--http-port={self.http_port}",
                    "--grpc-address=127.0.0.1",
                    f"--grpc-port={self.grpc_port}",
                    "--metrics-address=127.0.0.1",
                    f"--metrics-port={self.metrics_port}",
                    # NOTE: 2.51 can wait its whole 30 s exit timeout for a decoupled stream's
                    # state at SIGTERM (seen in two tests' teardowns); a test's own flag wins
                    "--exit-timeout-secs=5",
                    f"--backend-config=python,shm-region-prefix-name={self.region_prefix}",
                    *argv,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=run_env,
                start_new_session=True,  # NOTE: its stubs too, for ``stop`` (process group)
            )

    def __enter__(self) -> RealTriton:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop(wait=False)

    def log(self) -> str:
        """Everything tritonserver printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_live(self, timeout_s: float = 120.0) -> None:
        """Wait until ServerLive answers over gRPC and then ``/v2/health/live`` over HTTP.

        2.51 starts its gRPC endpoint before its HTTP one, so a live gRPC port does not mean
        the HTTP port listens yet (CI at 76cdb493: a test's first HTTP call was refused).

        Raises:
            RuntimeError: it exited or did not come up in time (with its log).
        """
        deadline = time.monotonic() + timeout_s
        wait_grpc_live(self.url, self.proc, self.log, timeout_s, "tritonserver")
        while not self._http_live():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {self.proc.returncode}:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver HTTP not live after {timeout_s}s:\n{self.log()}")
            time.sleep(LIVE_POLL_S)

    def _http_live(self) -> bool:
        """Whether ``/v2/health/live`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/live", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready_or_skip(self, timeout_s: float = 120.0) -> None:
        """Wait until ``/v2/health/ready`` answers 200; skip the calling test (after stopping
        it) when it exits or is not ready in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.skip(f"the real Triton exited during start-up: {self.log()[-800:]}")
            try:
                urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        pytest.skip(f"the real Triton was not ready after {timeout_s:.0f} s: {self.log()[-800:]}")

    def stop(self, wait: bool = True) -> None:
        """SIGTERM, then SIGKILL after 30 s; then unlink the python backend's regions of this
        server (named from ``region_prefix``), which a Triton that died or was killed leaves
        in /dev/shm, whenever that happened.

        ``wait=False`` returns after the SIGTERM and leaves the rest to a thread that
        ``wait_stopped()`` joins: a teardown that needs nothing more of this server does not
        wait for its exit (2.51 checks its models once a second while it shuts down: 2-3 s
        for one python model)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        if wait:
            _finish_stop(self.proc, self.region_prefix)
            return
        reaper = threading.Thread(
            target=_finish_stop,
            args=(self.proc, self.region_prefix),
            name="triton-stop",
            daemon=True,
        )
        reaper.start()
        _STOPPING.append(reaper)


_STOPPING: list[threading.Thread] = []
"""The threads finishing ``RealTriton.stop(wait=False)`` calls."""


def _finish_stop(proc: subprocess.Popen[bytes], region_prefix: str) -> None:
    """Wait for a SIGTERMed tritonserver (SIGKILL after 30 s), SIGKILL what is left of its
    process group (a python model's stub outlives a server stopped while it loads models:
    seen running 20 minutes later), then unlink its python backend's regions (those whose
    names start with ``region_prefix``)."""
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    # NOTE: the SIGKILL is delivered, not yet acted on: a stub could still be listed as
    # running right after (test_triton_peer_regions saw it in CI)
    deadline = time.monotonic() + 10
    while _group_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    for path in left_regions(region_prefix):
        path.unlink(missing_ok=True)


def _group_running(pgid: int) -> bool:
    """Whether a process of process group ``pgid`` is still running (a zombie is not)."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def wait_stopped() -> list[Path]:
    """Wait until every real Triton stopped with ``wait=False`` has exited and its regions
    are gone (the test session's end); returns the python-backend regions of this test
    process's Tritons that are still there (of one never stopped), after unlinking them."""
    while _STOPPING:
        _STOPPING.pop().join()
    left = left_regions()
    for path in left:
        path.unlink(missing_ok=True)
    return left


def start_triton(repository: Path, log_path: Path, *flags: str) -> RealTriton:
    """Start tritonserver on ``repository`` with ``flags`` and wait until it is ready; skips
    the test when it cannot run here. ``with start_triton(...) as peer:`` stops it (by PID)
    when the block ends, without waiting for its exit."""
    env = require_peers()
    caches = Path(env["TRITON_BACKENDS"]).parent / "caches"
    peer = RealTriton(
        env, log_path, f"--model-repository={repository}", f"--cache-directory={caches}", *flags
    )
    peer.wait_ready_or_skip()
    return peer


@contextmanager
def side_by_side(
    repository: Path,
    logs: Path,
    *flags: str,
    ours_only: tuple[str, ...] = (),
    with_cache: bool = False,
) -> Iterator[dict[str, ServerProcess | RealTriton]]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed, both serving
    ``repository`` with ``flags`` (tritonserver's, which both take; logs ``ours.log`` /
    ``triton.log`` in ``logs``), and triton-mp ``ours_only`` too; ``with_cache``: Triton
    finds its response cache libraries (``--cache-directory``, as ``start_triton``). Triton
    is started before ours is live, so they come up side by side. Both are stopped (by PID)
    when the block ends."""
    ours = ServerProcess(repository, logs / "ours.log", *flags, *ours_only)
    theirs: RealTriton | None = None
    env = peers_env()
    try:
        if env is not None:
            caches = Path(env["TRITON_BACKENDS"]).parent / "caches"
            theirs = RealTriton(
                env,
                logs / "triton.log",
                f"--model-repository={repository}",
                *([f"--cache-directory={caches}"] if with_cache else []),
                *flags,
            )
        ours.wait_live()
        found: dict[str, ServerProcess | RealTriton] = {"triton-mp": ours}
        if theirs is not None:
            theirs.wait_live()
            found["triton"] = theirs
        yield found
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()


class PythonModel(NamedTuple):
    """A python-backend model of a side-by-side repository: its ``config.pbtxt`` and
    ``1/model.py`` (both dedented; ``IDENTITY_PY``, INPUT0 answered as OUTPUT0, unless
    named), and ``files``: more files of the model's directory, (relative path, text) each
    (a label file)."""

    config: str
    source: str = IDENTITY_PY
    files: tuple[tuple[str, str], ...] = ()


class Ensemble(NamedTuple):
    """An ensemble of a side-by-side repository: its ``config.pbtxt`` (an empty ``1/``)."""

    config: str


Models = Mapping[str, PythonModel | Ensemble | Path]
"""A repository's models by name: written from their files, or a model directory copied."""


def write_models(repository: Path, models: Models) -> Path:
    """Write ``models`` into ``repository`` (created); returns it."""
    repository.mkdir(parents=True, exist_ok=True)
    for name, model in models.items():
        if isinstance(model, Path):
            shutil.copytree(model, repository / name)
        elif isinstance(model, Ensemble):
            (repository / name / "1").mkdir(parents=True)
            (repository / name / "config.pbtxt").write_text(model.config)
        else:
            folder = write_python_model(repository, name, model.config, model.source)
            for relative, text in model.files:
                (folder / relative).write_text(text)
    return repository


@contextmanager
def serve_models(
    models: Models,
    work: Path,
    *flags: str,
    ours_only: tuple[str, ...] = (),
    with_cache: bool = False,
) -> Iterator[dict[str, ServerProcess | RealTriton]]:
    """``side_by_side`` on a repository of ``models`` written in ``work`` (``work/repo``;
    the logs beside it)."""
    repository = write_models(work / "repo", models)
    with side_by_side(
        repository, work, *flags, ours_only=ours_only, with_cache=with_cache
    ) as found:
        yield found


def urls_of(servers: Mapping[str, ServerProcess | RealTriton], which: str) -> tuple[str, str]:
    """The gRPC and HTTP ``host:port`` of ``servers[which]`` (``triton-mp`` or ``triton``);
    skips the calling test when ``which`` is not there (the real Triton is not installed)."""
    if which not in servers:
        pytest.skip(f"the real Triton is not installed ({_INSTALL})")
    return servers[which].url, servers[which].http_url
