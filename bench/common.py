"""What the benchmarks in bench/ share: the peers, server processes, perf_analyzer runs, tables.

- ``ensure_peers`` / ``load_peers_env``: ``bench/peers/install-peers.sh`` and its env file.
- ``TritonMP``: ``triton-mp start`` on free ports, in its own session; ``Triton``: the real
  tritonserver through ``bench/peers/run-triton.sh``. Both wait until their models are
  loaded (or known to have failed), and stop by PID (SIGINT, then SIGKILL after a timeout),
  checking that no process of theirs and no ``/dev/shm`` entry they held is left behind.
- ``run_pa``: one perf_analyzer measurement through the ``bench/pa_run.py`` wrapper.
- ``fmt`` / ``med``: table cells and medians that tolerate missing values.

The scripts import it as ``common`` (they run as ``python bench/NAME.py``, so bench/ is on
``sys.path``). Standard library only at import time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PEERS_SCRIPTS = BENCH / "peers"
DEFAULT_PA_RUN = BENCH / "pa_run.py"
DEFAULT_PEERS_ENV = ROOT / ".peers" / "peers.env"
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------- the machine


def machine_busy_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (as pa_run.py counts them)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, start time in ticks, utime+stime in ticks) for every live process."""
    table = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(d)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                pass
    return table


def descendants(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of root; the start time guards PID reuse."""
    table = proc_table()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, (pp, _, _) in table.items() if pp == pid]
        found += [(p, table[p][1]) for p in kids]
        todo += kids
    return found


def tree_cpu_seconds(root: int) -> float:
    """user+system CPU seconds of root and its live descendants (as pa_run.py counts them)."""
    table = proc_table()
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            total += table[pid][2]
            todo += [p for p, (pp, _, _) in table.items() if pp == pid]
    return total / TICK


def start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int) -> bool:
    """pid still runs and is the process that started at `start` (not a reused PID)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == start and fields[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def shm_names(marker: str) -> set[str]:
    """/dev/shm entries whose name contains `marker` (segments, and sem.* semaphores)."""
    try:
        return {n for n in os.listdir("/dev/shm") if marker in n}
    except FileNotFoundError:
        return set()


def shm_in_use(pids: list[int], marker: str) -> set[str]:
    """Names under /dev/shm containing `marker` that these processes map or hold open."""
    used = set()
    for pid in pids:
        paths = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths += [ln.split(None, 5)[-1].strip() for ln in f if "/dev/shm/" in ln]
        except OSError:
            pass
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
        for p in paths:
            if p.startswith("/dev/shm/"):
                name = p[len("/dev/shm/") :].split(" ")[0]
                if marker in name:
                    used.add(name)
    return used


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def kill_tree_leftovers(tree: list[tuple[int, int]], grace: float) -> list[dict[str, Any]]:
    """Wait up to `grace` s for these processes to end; SIGKILL (by PID) and report the rest."""
    end = time.monotonic() + grace
    left = [(p, s) for p, s in tree if alive(p, s)]
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = [(p, s) for p, s in left if alive(p, s)]
    report = []
    for pid, start in left:
        report.append({"pid": pid, "cmdline": cmdline(pid)})
        try:
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return report


# --------------------------------------------------------------------------- the peers


def ensure_peers(peers_env: Path, install: bool = True) -> None:
    """Run bench/peers/install-peers.sh (idempotent) when the env file or its programs
    are missing."""
    if peers_env.is_file():
        try:
            env = load_peers_env(peers_env)
            if env.get("TRITONSERVER") and os.access(env["TRITONSERVER"], os.X_OK):
                return
        except BenchError:
            pass
    script = PEERS_SCRIPTS / "install-peers.sh"
    if not install:
        raise BenchError(f"{peers_env} missing or incomplete: run bash {script} .peers")
    if not script.is_file():
        raise BenchError(f"{peers_env} missing and no {script} to install the peers with")
    print(f"installing the peers: bash {script} {peers_env.parent}", flush=True)
    p = subprocess.run(["bash", str(script), str(peers_env.parent)], cwd=ROOT)
    if p.returncode != 0:
        raise BenchError(f"install-peers.sh failed with status {p.returncode}")


def load_peers_env(path: Path) -> dict[str, str]:
    """The environment after sourcing peers.env (PERF_ANALYZER, LD_LIBRARY_PATH for libcudart,
    TRITONSERVER, ...)."""
    if not path.is_file():
        raise BenchError(f"{path} not found: run bash bench/peers/install-peers.sh .peers")
    out = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; env -0', "_", str(path)], check=True, capture_output=True
    ).stdout
    env = dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
    if not env.get("PERF_ANALYZER") or not os.access(env["PERF_ANALYZER"], os.X_OK):
        raise BenchError(f"{path} names no executable PERF_ANALYZER")
    return env


# --------------------------------------------------------------------------- servers


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
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        self.pid_start = start_ticks(self.pid)
        self.model_errors = self.wait_models(models, t0)
        self.started(t0)
        self.info["model_errors"] = self.model_errors
        return self.model_errors


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
        self.pid_start = start_ticks(self.pid)
        self.model_errors = self.wait_models(models, t0)
        self.started(t0)
        self.info["model_errors"] = self.model_errors
        return self.model_errors


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

        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = self.proc.pid
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


# --------------------------------------------------------------------------- perf_analyzer


def run_pa(
    pa_run: Path,
    peers_env: dict[str, str],
    server: ManagedServer,
    label: str,
    pa_args: list[str],
    window_ms: int,
    attempts: int,
    jsonl: Path,
    protocol: str = "grpc",
) -> dict[str, Any]:
    """One perf_analyzer measurement through pa_run.py, over gRPC (against server.url) or
    HTTP/REST (``protocol="http"``, against 127.0.0.1:server.http).

    pa_args: what follows ``perf_analyzer -i PROTOCOL -u URL -p WINDOW``. Returns pa_run's
    record (throughput, p50_us, p99_us, client/server/machine cores, server queue/compute us,
    ...), or {"error": ...} without throughput when perf_analyzer gave no result."""
    assert server.pid is not None
    url = server.url if protocol == "grpc" else f"127.0.0.1:{server.http}"
    pa = [
        peers_env["PERF_ANALYZER"],
        "-i",
        protocol,
        "-u",
        url,
        "-p",
        str(window_ms),
        *pa_args,
    ]
    cmd = [
        sys.executable,
        str(pa_run),
        "--label",
        label,
        "--server-pid",
        str(server.pid),
        "--out",
        str(jsonl),
        "--attempts",
        str(attempts),
        "--",
        *pa,
    ]
    # perf_analyzer needs 3 stable windows; allow it ten, per attempt, plus start-up.
    timeout = attempts * (10 * window_ms / 1000 + 60)
    p = subprocess.Popen(
        cmd, env=peers_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException as e:  # timeout, or Ctrl-C: end pa_run and its perf_analyzer by PID
        tree = descendants(p.pid)
        p.kill()
        kill_tree_leftovers(tree, grace=0)
        p.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return {"label": label, "rc": None, "error": f"no result after {timeout:.0f} s"}
    server.snapshot()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        return {
            "label": label,
            "rc": p.returncode,
            "error": (out + err).strip()[-600:] or "pa_run printed nothing",
        }
    rec: dict[str, Any] = json.loads(lines[-1])
    if rec.get("throughput") is None and not rec.get("error"):
        rec["error"] = "perf_analyzer failed"
    return rec


def other_cores(rec: dict[str, Any]) -> float | None:
    """Cores the rest of the machine used during a pa_run record: busy - client - server."""
    try:
        return round(
            max(
                0.0,
                float(rec["machine_cores_busy"])
                - float(rec["client_cores"])
                - float(rec["server_cores"]),
            ),
            2,
        )
    except (KeyError, TypeError):
        return None


def last_line(text: str | None, limit: int = 200) -> str:
    """The last non-empty line of an error text, cut to `limit` characters."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return (lines[-1] if lines else "failed")[-limit:]


# --------------------------------------------------------------------------- report


def fmt(v: Any, spec: str) -> str:
    """format(v, spec), or a dash as wide as the spec's width when v is None."""
    width = re.match(r"\d*", spec).group()  # type: ignore[union-attr]  # \d* always matches
    return ("-".rjust(int(width)) if width else "-") if v is None else format(v, spec)


def med(values: list[Any]) -> Any:
    """Median of the values that are not None (an int stays an int); None when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return type(vals[0])(m) if isinstance(vals[0], int) else m
