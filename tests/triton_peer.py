"""The real Triton 2.51 (``.peers/``) as a subprocess with any flags (not a test module).

For side-by-side tests that run the same repository, flags and client calls against
triton-mp and Triton. ``start_triton`` skips the calling test when the peers are not
installed (``bash bench/peers/install-peers.sh .peers``) or Triton does not come up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.server import REPO_ROOT, free_port

PEERS_ENV = Path(os.environ.get("PEERS_ENV", REPO_ROOT / ".peers" / "peers.env"))


def peers_environment() -> dict[str, str]:
    """The variables peers.env exports (TRITONSERVER, TRITON_BACKENDS, ...), or a skip."""
    if not PEERS_ENV.exists():
        pytest.skip(
            "the real Triton is not installed (run: bash bench/peers/install-peers.sh .peers)"
        )
    out = subprocess.run(
        ["bash", "-c", f'. "{PEERS_ENV}" && env -0'],
        capture_output=True,
        check=True,
    ).stdout.decode()
    env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    if not Path(env.get("TRITONSERVER", "")).exists():
        pytest.skip("the peers folder has no tritonserver binary")
    return env


@dataclass
class TritonPeer:
    """A running tritonserver: its pid, URLs and log."""

    proc: subprocess.Popen[bytes]
    url: str
    http_url: str
    metrics_port: int
    log_path: Path

    def log(self) -> str:
        """What Triton printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_triton(repository: Path, log_path: Path, *flags: str) -> TritonPeer:
    """Start tritonserver on ``repository`` with ``flags`` (127.0.0.1, free ports) and wait
    until it is ready; skips the test when it cannot run here."""
    env = peers_environment()
    http, grpc, metrics = free_port(), free_port(), free_port()
    backends = env["TRITON_BACKENDS"]
    cmd = [
        env["TRITONSERVER"],
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--cache-directory={Path(backends).parent / 'caches'}",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
        *flags,
    ]
    # NOTE: the stub's env first on PATH: the python models' interpreter finds numpy there.
    run_env = {**os.environ, **env, "PATH": f"{env['TRITON_STUB_ENV']}/bin:{os.environ['PATH']}"}
    log = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env)
    log.close()
    peer = TritonPeer(proc, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}", metrics, log_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"the real Triton exited during start-up: {peer.log()[-800:]}")
        try:
            urllib.request.urlopen(f"http://{peer.http_url}/v2/health/ready", timeout=1)
            return peer
        except OSError:
            time.sleep(0.2)
    peer.stop()
    pytest.skip(f"the real Triton was not ready after 120 s: {peer.log()[-800:]}")
