"""Server process trees the benchmarks start, watch and stop by PID.

- ``ManagedServer``: the shared life cycle (wait for models, snapshot, stop, leftovers check).
- ``TritonMP``: ``triton-mp start`` on free ports, in its own session; ``Triton``: the real
  tritonserver through ``bench/peers/run-triton.sh``; ``Floor``: the Python or native floor.
  Each waits until its models are loaded (or known to have failed), and stops by PID (SIGINT,
  then SIGKILL after a timeout), checking that no process of its own and no ``/dev/shm`` entry
  it held is left behind.

Standard library only at import time.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peers_env import BENCH, PEERS_SCRIPTS, ROOT, BenchError
from procs import (
    alive,
    descendants,
    free_ports,
    kill_tree_leftovers,
    shm_in_use,
    shm_names,
    start_ticks,
    tree_cpu_seconds,
)


class ManagedServer:
    """A server process tree that the benchmark starts, watches and stops by PID.

    Subclasses set self.pid (and self.proc when the server is our child), self.url, and call
    self.wait_models() from start(). `shm_marker` names the /dev/shm entries that are the
    server's own (checked after the stop)."""

    kind = "server"
    shm_marker = "\0"  # matches nothing unless a subclass says otherwise
    stop_signal = signal.SIGINT  # what stop() sends first (SIGKILL follows after stop_timeout)
    clean_exit_codes: tuple[int | None, ...] = (0, None)  # None: not our child, status unknown

    def __init__(self, log_path: Path, start_timeout: float, stop_timeout: float) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        self.url = f"127.0.0.1:{self.grpc}"
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.pid: int | None = None
        self.pid_start: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.tree: list[tuple[int, int]] = []
        self.shm_before = shm_names(self.shm_marker)
        self.shm_seen: set[str] = set()
        self.model_errors: dict[str, str] = {}
        self.info: dict[str, Any] = {"server": self.kind, "log": str(log_path)}

    # ---- start-up
    def start(self, models: list[str]) -> dict[str, str]:
        """Start, wait for `models`; returns {model: why it is not ready} for those that
        failed to load; raises BenchError when the server itself does not come up."""
        raise NotImplementedError

    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return (
            self.pid is not None and self.pid_start is not None and alive(self.pid, self.pid_start)
        )

    def wait_models(self, models: list[str], t0: float) -> dict[str, str]:
        """Wait until the server is live and every model is ready or has failed to load
        (RepositoryIndex: UNAVAILABLE with a reason). Returns {model: reason} for the ones
        that are not ready; raises BenchError when the server dies or the deadline passes."""
        import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]

        client = grpcclient.InferenceServerClient(self.url)
        deadline = t0 + self.start_timeout
        try:
            while True:
                if not self.running():
                    code = self.proc.returncode if self.proc is not None else "?"
                    raise BenchError(
                        f"{self.kind} exited with status {code} during start-up\n{self.log_tail()}"
                    )
                failed: dict[str, str] = {}
                pending = []
                try:
                    if client.is_server_live(client_timeout=1):
                        index = {
                            m.name: m
                            for m in client.get_model_repository_index(client_timeout=2).models
                        }
                        for name in models:
                            if client.is_model_ready(name, client_timeout=1):
                                continue
                            m = index.get(name)
                            if m is None:
                                failed[name] = "not in the model repository"
                            elif m.reason:
                                failed[name] = f"{m.state}: {m.reason}"
                            else:
                                pending.append(name)
                    else:
                        pending = models
                except Exception:  # not listening yet
                    pending = models
                if not pending:
                    return failed
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{self.kind}: {', '.join(pending)} not ready after "
                        f"{self.start_timeout:.0f} s\n{self.log_tail()}"
                    )
                time.sleep(0.2)
        finally:
            client.close()

    def spawn(self, env: dict[str, str] | None = None) -> float:
        """Start ``self.cmd`` as our child in its own session, its output to ``self.log_path``;
        returns the monotonic time it started at."""
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        return t0

    def ready(self, models: list[str], t0: float) -> dict[str, str]:
        """After the start at ``t0`` (self.pid set): wait for ``models`` and record the start;
        returns {model: why it is not ready} for models that failed."""
        assert self.pid is not None
        self.pid_start = start_ticks(self.pid)
        self.model_errors = self.wait_models(models, t0)
        self.started(t0)
        self.info["model_errors"] = self.model_errors
        return self.model_errors

    def started(self, t0: float) -> None:
        assert self.pid is not None
        self.pid_start = start_ticks(self.pid)
        self.info["pid"] = self.pid
        self.info["ready_s"] = round(time.monotonic() - t0, 2)
        self.snapshot()
        self.info["processes_when_ready"] = 1 + len(self.tree)

    # ---- while it runs
    def snapshot(self) -> None:
        """Remember the process tree and the shm it uses, to check the stop against."""
        if self.pid is None or not self.running():
            return
        tree = descendants(self.pid)
        known = set(self.tree)
        self.tree += [t for t in tree if t not in known]
        self.shm_seen |= shm_in_use([self.pid] + [p for p, _ in tree], self.shm_marker)

    def idle_cores(self, seconds: float = 1.0) -> float | None:
        """Average cores the whole tree uses over `seconds` of no requests."""
        if self.pid is None or not self.running():
            return None
        c0, t0 = tree_cpu_seconds(self.pid), time.monotonic()
        time.sleep(seconds)
        return round((tree_cpu_seconds(self.pid) - c0) / (time.monotonic() - t0), 3)

    # ---- stop
    def _wait_exit(self, timeout: float) -> bool:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        end = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > end:
                return False
            time.sleep(0.1)
        return True

    def stop(self) -> dict[str, Any]:
        """stop_signal (SIGINT), then SIGKILL after stop_timeout; then kill (by PID) and list
        any process of the tree that outlived it, and list (then remove) the /dev/shm entries
        it held that are left."""
        if self.pid is None:
            return self.info
        self.snapshot()
        t0 = time.monotonic()
        how = self.stop_signal.name
        if self.running():
            os.kill(self.pid, self.stop_signal)
            if not self._wait_exit(self.stop_timeout):
                how = f"SIGKILL after {self.stop_timeout:.0f} s"
                os.kill(self.pid, signal.SIGKILL)
                self._wait_exit(10)
        else:
            how = "had already exited"
        exit_code = self.proc.returncode if self.proc is not None else None
        self.info.update(stop=how, exit_code=exit_code, stop_s=round(time.monotonic() - t0, 2))
        self.info["leftover_processes"] = kill_tree_leftovers(self.tree, grace=2.0)
        after = shm_names(self.shm_marker)
        self.info["shm_left"] = sorted(after & self.shm_seen)  # held by the server: its own
        for name in self.info["shm_left"]:  # reported above; its processes are gone: tidy up
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")
        self.info["shm_new_unattributed"] = sorted((after - self.shm_before) - self.shm_seen)
        self.info["clean"] = (
            how == self.stop_signal.name
            and exit_code in self.clean_exit_codes
            and not self.info["leftover_processes"]
            and not self.info["shm_left"]
        )
        self.pid = None
        self.proc = None
        return self.info

    def stop_line(self) -> str:
        i = self.info
        line = (
            f"{self.kind} stopped: {i.get('stop')}"
            + (f", exit {i['exit_code']}" if i.get("exit_code") is not None else "")
            + f", leftover processes {len(i.get('leftover_processes', []))}, "
            f"/dev/shm left {i.get('shm_left')}"
        )
        if i.get("shm_new_unattributed"):
            line += (
                f"\n  note: new /dev/shm entries not seen in its processes (another test?):"
                f" {i['shm_new_unattributed']}"
            )
        return line

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(["--- end of " + str(self.log_path)] + lines[-n:])


class TritonMP(ManagedServer):
    """`triton-mp start` in its own session, so a Ctrl-C on the bench reaches it only through
    stop(); its log goes to a file. server_cmd: what comes before --model-repository (default:
    this checkout's, as 'python -m triton_mp start' with `src` first on PYTHONPATH);
    extra_args: more flags after the ports (e.g. ``--disable-auto-complete-config``)."""

    kind = "triton-mp"
    shm_marker = "triton_mp"  # segments triton_mp_*, posix semaphores sem.triton_mp_*

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        server_cmd: str | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        src: Path = ROOT / "src",
        extra_args: list[str] | None = None,
    ) -> None:
        super().__init__(log_path, start_timeout, stop_timeout)
        env = dict(os.environ)
        if server_cmd:
            base = shlex.split(server_cmd)
        else:
            # `triton-mp start` of THIS checkout: the `triton-mp` on PATH may be an editable
            # install of another one.
            base = [sys.executable, "-m", "triton_mp", "start"]
            env["PYTHONPATH"] = os.pathsep.join(
                [str(src)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
            )
        self.cmd = base + [
            "--model-repository",
            str(repository),
            "--grpc-port",
            str(self.grpc),
            "--http-port",
            str(self.http),
            "--metrics-port",
            str(self.metrics),
            # NOTE: client shared memory is off by default in Triton 2.51's manner; the shm
            # workloads need it.
            "--allow-client-shm=true",
            *(extra_args or []),
        ]
        self.env = env
        self.info["cmd"] = shlex.join(self.cmd)

    def start(self, models: list[str]) -> dict[str, str]:
        """Start and wait; returns {model: why it is not ready} for models that failed."""
        t0 = self.spawn(self.env)
        return self.ready(models, t0)


class Triton(ManagedServer):
    """The real tritonserver, started by bench/peers/run-triton.sh (in its own session,
    so a Ctrl-C on the bench does not reach it). The script prints the server's PID once
    /v2/health/ready answers; tritonserver is then no child of ours (stopped by that PID)."""

    kind = "Triton"
    shm_marker = "triton_python_backend_shm_region"

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        peers_env: Path,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
    ) -> None:
        super().__init__(log_path, start_timeout, stop_timeout)
        self.script = PEERS_SCRIPTS / "run-triton.sh"
        self.cmd = [
            "bash",
            str(self.script),
            str(repository),
            str(self.http),
            str(self.grpc),
            str(self.metrics),
        ]
        self.env = dict(os.environ, PEERS_ENV=str(peers_env), TRITON_LOG=str(log_path))
        self.info["cmd"] = shlex.join(self.cmd)

    def start(self, models: list[str]) -> dict[str, str]:
        t0 = time.monotonic()
        p = subprocess.Popen(
            self.cmd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            # the script itself gives up after 2 minutes
            out, err = p.communicate(timeout=max(self.start_timeout, 130.0))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        pid = out.strip().splitlines()[-1] if out.strip() else ""
        if p.returncode != 0 or not pid.isdigit():
            raise BenchError(
                f"run-triton.sh failed (status {p.returncode}): "
                f"{err.strip()[-1500:]}\n{self.log_tail()}"
            )
        self.pid = int(pid)
        return self.ready(models, t0)


class Floor(ManagedServer):
    """The Python floor, ``bench/floor_server.py``: one grpc.aio process that
    computes ``add_sub_py`` inline in the handler (no queue, no batching, no workers), as our
    child in its own session; with ``script``, another floor of the same kind
    (``bench/floor_identity.py``, which echoes ``identity_py``). It serves gRPC only
    (``self.http`` is unused) and answers ModelReady but not RepositoryIndex, so start()
    waits on ModelReady alone. It is stopped with SIGTERM (no handler: the process ends at
    once, exit -15, a clean stop): on SIGINT its grpc.aio shutdown sometimes hangs until the
    SIGKILL."""

    kind = "floor"
    stop_signal = signal.SIGTERM
    clean_exit_codes = (-signal.SIGTERM,)

    def __init__(
        self,
        log_path: Path,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        script: Path | None = None,
    ) -> None:
        super().__init__(log_path, start_timeout, stop_timeout)
        # NOTE: script: bench/floor_identity.py for the large-tensor floor (no --impl).
        self.cmd = (
            [
                sys.executable,
                str(BENCH / "floor_server.py"),
                "--port",
                str(self.grpc),
                "--impl",
                "aio",
            ]
            if script is None
            else [sys.executable, str(script), "--port", str(self.grpc)]
        )
        self.info["cmd"] = shlex.join(self.cmd)

    def start(self, models: list[str]) -> dict[str, str]:
        import tritonclient.grpc as grpcclient

        t0 = self.spawn()
        self.pid_start = start_ticks(self.pid)
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while True:
                if not self.running():
                    raise BenchError(
                        f"floor exited with status {self.proc.returncode} during "
                        f"start-up\n{self.log_tail()}"
                    )
                try:
                    if all(client.is_model_ready(m, client_timeout=1) for m in models):
                        break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                if time.monotonic() > t0 + self.start_timeout:
                    raise BenchError(
                        f"floor: not ready after {self.start_timeout:.0f} s\n{self.log_tail()}"
                    )
                time.sleep(0.2)
        finally:
            client.close()
        self.started(t0)
        self.info["model_errors"] = {}
        return {}
