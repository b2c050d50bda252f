"""A triton-mp server the analyzer starts for itself (when no ``--url`` is given).

``triton-mp start`` in explicit model-control mode with only the analysed model loaded, on
free ports of 127.0.0.1, in its own session (process group), its log in the output
folder. It starts with ``--disable-auto-complete-config`` so every variant is served as
written (auto-complete would turn dynamic batching back on for an onnxruntime model that
can batch, as Triton's does); a model whose config needs auto-complete is started again
with it on. Stopped with SIGINT (a clean drain), then SIGKILL to its group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from triton_mp.analyze.probe.client import ServerClient, ServerError

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LaunchedServer:
    """One ``triton-mp start`` child serving ``model`` from ``repository``.

    Attributes:
        http_url / grpc_url / metrics_url: ``127.0.0.1:<port>`` of each endpoint.
        pid: the supervisor's pid (also its process group id).
        auto_complete: whether the server auto-completes configs.
    """

    def __init__(self, repository: Path, model: str, log_path: Path, *flags: str) -> None:
        self._repository, self._model, self._log_path = repository, model, log_path
        self._flags = list(flags)
        self.auto_complete = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_url = self.grpc_url = self.metrics_url = ""
        self.pid = 0

    def _spawn(self) -> None:
        ports = [free_port() for _ in range(3)]
        self.http_url, self.grpc_url, self.metrics_url = (f"127.0.0.1:{p}" for p in ports)
        cmd = [sys.executable, "-m", "triton_mp", "start"]
        cmd += ["--model-repository", str(self._repository), "--model-control-mode", "explicit"]
        cmd += ["--load-model", self._model, "--http-address", "127.0.0.1"]
        cmd += ["--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"]
        cmd += [f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}"]
        if not self.auto_complete:
            cmd.append("--disable-auto-complete-config")
        with open(self._log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd + self._flags, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.proc.pid

    def start(self, timeout_s: float = 180.0) -> None:
        """Start and wait until the model is ready (retrying with auto-complete on).

        Raises:
            ServerError: the server did not serve the model either way (see its log).
        """
        for auto_complete in (False, True):
            self.auto_complete = auto_complete
            self._spawn()
            try:
                self._wait_ready(timeout_s)
                return
            except ServerError as e:
                self.stop()
                if auto_complete:
                    raise ServerError(f"{e} (server log: {self._log_path})") from None
                log.warning(
                    "'%s' needs config auto-complete; starting the server with it", self._model
                )

    def _wait_ready(self, timeout_s: float) -> None:
        client = ServerClient(self.http_url)
        client.wait_live(
            timeout_s, alive=lambda: self.proc is not None and self.proc.poll() is None
        )
        deadline = time.monotonic() + timeout_s
        while not client.model_ready(self._model):
            if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                raise ServerError(f"model '{self._model}' did not become ready")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGINT, wait, then SIGKILL the whole group; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
