"""Load generators: perf_analyzer when installed, else triton-mp's own closed loop.

``perf_analyzer`` (NVIDIA's, what Model Analyzer runs) is found through ``--perf-analyzer``,
``$PERF_ANALYZER``, ``PATH``, or a ``.peers/peers.env`` in the working directory (what
``bench/peers/install-peers.sh`` writes). It runs one concurrency per call
(``--concurrency-range C:C``, ``--measurement-interval``, ``-f`` CSV); a run that finds no
three stable windows (a loaded machine drifts) is repeated with a looser stability band,
then with doubled windows and a band that accepts any three windows (their mean is still a
measurement, only a noisier one).

``BuiltinLoad`` is the project's own generator for machines without perf_analyzer:
``concurrency`` threads, each a keep-alive HTTP/REST connection sending one request at a
time (KServe v2 with Triton's binary tensor extension, random inputs of the config's
shapes), over a warm-up then a measurement window. It measures the same figures but spends
this machine's CPU in Python threads, so its ceiling is lower; the report names which
generator measured.
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np

from triton_mp.common.datatypes import DataType


class LoadError(Exception):
    """The load generator failed (its message says why)."""


class LoadFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What a load generator measured (client side; latencies in microseconds)."""

    throughput_per_s: float
    p50_us: float
    p95_us: float
    p99_us: float


class LoadGenerator(Protocol):
    """Drives one model at one concurrency and measures it."""

    name: str

    def run(self, model: str, concurrency: int) -> LoadFigures:
        """Measure ``model`` with ``concurrency`` requests in flight.

        Raises:
            LoadError: the measurement failed.
        """
        ...


def find_perf_analyzer(explicit: str | None = None) -> tuple[str, dict[str, str]] | None:
    """``(path, environment)`` of perf_analyzer, or None when none is installed."""
    env = dict(os.environ)
    for candidate in (explicit, env.get("PERF_ANALYZER"), shutil.which("perf_analyzer")):
        if candidate and Path(candidate).is_file():
            return candidate, env
    peers = Path.cwd() / ".peers" / "peers.env"
    if peers.is_file() and shutil.which("bash"):
        out = subprocess.run(
            ["bash", "-c", f"source {shlex.quote(str(peers))} && env -0"],
            capture_output=True,
            check=False,
        ).stdout.decode()
        penv = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
        path = penv.get("PERF_ANALYZER", "")
        if path and Path(path).is_file():
            return path, penv
    return None


class PerfAnalyzer:
    """perf_analyzer at one concurrency per run.

    Args:
        path / env: from ``find_perf_analyzer``.
        url: the endpoint it drives (``host:port``). protocol: ``grpc`` or ``http``.
        window_ms: ``--measurement-interval``. shapes: ``--shape NAME:D1,D2`` values.
        timeout_s: one run's limit.
    """

    name = "perf_analyzer"

    def __init__(
        self,
        path: str,
        env: dict[str, str],
        *,
        url: str,
        protocol: str,
        window_ms: int,
        shapes: Sequence[str] = (),
        timeout_s: float = 300.0,
    ) -> None:
        self._path, self._env, self._url, self._protocol = path, env, url, protocol
        self._window_ms, self._shapes, self._timeout_s = window_ms, list(shapes), timeout_s
        self.proc: subprocess.Popen[str] | None = None

    def _command(
        self, model: str, concurrency: int, csv_path: str, stability: int, window_ms: int
    ) -> list[str]:
        cmd = [self._path, "-m", model, "-u", self._url, "-i", self._protocol]
        cmd += [f"--concurrency-range={concurrency}:{concurrency}"]
        cmd += [f"--measurement-interval={window_ms}", f"--stability-percentage={stability}"]
        cmd += ["--max-trials=6", "-f", csv_path]
        for shape in self._shapes:
            cmd += ["--shape", shape]
        return cmd

    def run(self, model: str, concurrency: int) -> LoadFigures:
        with tempfile.TemporaryDirectory(prefix="triton_mp_analyze_") as tmp:
            csv_path = os.path.join(tmp, "pa.csv")
            output = ""
            attempts = ((25, 1), (100, 1), (1000, 2))
            for stability, windows in attempts:
                # NOTE: Popen (not run) so an interrupt can stop it: the runner kills
                # ``self.proc`` on Ctrl-C, and the child never outlives the analyzer.
                self.proc = subprocess.Popen(
                    self._command(
                        model, concurrency, csv_path, stability, self._window_ms * windows
                    ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=self._env,
                )
                try:
                    output, _ = self.proc.communicate(timeout=self._timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.communicate()
                    raise LoadError(f"perf_analyzer ran over {self._timeout_s:g}s") from None
                finally:
                    rc, self.proc = self.proc.returncode, None
                if rc == 0 or "stable" not in output:
                    break
            if rc != 0 or not os.path.exists(csv_path):
                raise LoadError(f"perf_analyzer failed ({rc}): {output.strip()[-400:]}")
            with open(csv_path) as f:
                row = list(csv.DictReader(f))[-1]
        return LoadFigures(
            throughput_per_s=float(row["Inferences/Second"]),
            p50_us=float(row["p50 latency"]),
            p95_us=float(row["p95 latency"]),
            p99_us=float(row["p99 latency"]),
        )

    def stop(self) -> None:
        """Kill a run in progress (on interrupt)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


def _request_body(config: dict[str, Any], shapes: dict[str, list[int]]) -> tuple[bytes, int]:
    """One inference request (batch 1) with random inputs, as ``(body, json header length)``.

    Raises:
        LoadError: an input has a variable dimension and no ``--shape``, or is BYTES.
    """
    rng = np.random.default_rng(0)
    batching = int(config.get("max_batch_size", 0)) > 0
    inputs, blobs = [], []
    for tensor in config.get("input", []):
        name = tensor["name"]
        dims = shapes.get(name) or [int(d) for d in tensor.get("dims", [])]
        if any(d < 0 for d in dims):
            raise LoadError(f"input '{name}' has a variable shape: give --shape {name}:D1,D2")
        dtype = DataType.from_config_name(tensor["data_type"])
        if dtype.numpy is None or dtype is DataType.STRING:
            raise LoadError(f"the built-in load generator cannot make {dtype.wire} input '{name}'")
        shape = ([1] if batching else []) + dims
        data = (rng.random(shape) * 4).astype(dtype.numpy)
        blob = data.tobytes()
        inputs.append(
            {
                "name": name,
                "shape": shape,
                "datatype": dtype.wire,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    outputs = [{"name": t["name"], "parameters": {"binary_data": True}} for t in config["output"]]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + b"".join(blobs), len(header)


class BuiltinLoad:
    """triton-mp's closed-loop HTTP/REST load generator (see the module docstring).

    Args:
        url: the HTTP/REST endpoint (``host:port``). config: the model's config (JSON form).
        window_s / warmup_s: measurement window and warm-up. shapes: ``NAME -> dims``.
    """

    name = "triton-mp builtin (HTTP/REST closed loop)"

    def __init__(
        self,
        url: str,
        config: dict[str, Any],
        *,
        window_s: float,
        warmup_s: float = 0.5,
        shapes: dict[str, list[int]] | None = None,
    ) -> None:
        self._url, self._window_s, self._warmup_s = url, window_s, warmup_s
        self._body, self._header_len = _request_body(config, shapes or {})

    def _client(
        self, model: str, stop_at: float, start_at: float, out: list[float], errors: list[str]
    ) -> None:
        host, _, port = self._url.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        headers = {"Inference-Header-Content-Length": str(self._header_len)}
        path = f"/v2/models/{model}/infer"
        try:
            while (t0 := time.monotonic()) < stop_at:
                conn.request("POST", path, body=self._body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    errors.append(f"HTTP {resp.status}")
                    return
                if t0 >= start_at:
                    out.append(time.monotonic() - t0)
        except OSError as e:
            errors.append(str(e))
        finally:
            conn.close()

    def run(self, model: str, concurrency: int) -> LoadFigures:
        start_at = time.monotonic() + self._warmup_s
        stop_at = start_at + self._window_s
        lists: list[list[float]] = [[] for _ in range(concurrency)]
        errors: list[str] = []
        threads = [
            threading.Thread(target=self._client, args=(model, stop_at, start_at, lat, errors))
            for lat in lists
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise LoadError(f"builtin load generator: {errors[0]}")
        lat_s = np.array([v for lat in lists for v in lat])
        if lat_s.size == 0:
            raise LoadError("builtin load generator: no request completed in the window")
        p50, p95, p99 = np.percentile(lat_s * 1e6, [50, 95, 99])
        return LoadFigures(
            throughput_per_s=lat_s.size / self._window_s,
            p50_us=float(p50),
            p95_us=float(p95),
            p99_us=float(p99),
        )
