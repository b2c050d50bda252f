"""The soak's load (``bench/soak.py``): the models it serves and the clients that drive them.

Models (``write_repository``): ``add_sub`` (onnxruntime, dynamic batching) and ``add_sub_py``
(python) from the project's repository, ``soak_ens`` (an ensemble: add_sub, then add_sub_py
on its sum: ``OUTPUT0 = INPUT0 + 2 * INPUT1``) and ``acc_py`` (a python sequence model whose
output is the running sum of its sequence, Oldest strategy).

Clients (``Clients``): one thread per client, each on a connection of its own (grpc shares
one connection between channels to the same target unless told not to, which would put
every client on one frontend). Thread ``i`` speaks gRPC when ``i`` is even, HTTP/JSON (one
keep-alive ``http.client`` connection) when odd; every fourth gRPC thread sends its
``add_sub`` inputs through a system shared-memory region of its own. Each request checks its
answer; each error is recorded with its time, protocol and words, for ``soak.py`` to judge.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
import tritonclient.utils.shared_memory as shm  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

MODELS = ("add_sub", "add_sub_py", "soak_ens", "acc_py")
SEQUENCE_LENGTH = 8
"""Requests per sequence of ``acc_py``."""

ENSEMBLE = """
name: "soak_ens"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      input_map { key: "INPUT1" value: "INPUT1" }
      output_map { key: "OUTPUT0" value: "S" }
    },
    {
      model_name: "add_sub_py"
      model_version: -1
      input_map { key: "INPUT0" value: "S" }
      input_map { key: "INPUT1" value: "INPUT1" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
    }
  ]
}
"""

ACC_CONFIG = """
name: "acc_py"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest {
    max_candidate_sequences: 32
    preferred_batch_size: [ 4 ]
    max_queue_delay_microseconds: 1000
  }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ACC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            cid = r.correlation_id()
            if r.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[cid] = np.zeros_like(x)
            self.sums[cid] = self.sums.get(cid, np.zeros_like(x)) + x
            out = pb_utils.Tensor("OUTPUT", self.sums[cid])
            responses.append(pb_utils.InferenceResponse([out]))
            if r.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sums.pop(cid, None)
        return responses
"""


def write_repository(root: Path, repo: Path) -> None:
    """The soak's model repository in ``repo`` (``root``: the project checkout)."""
    for m in ("add_sub", "add_sub_py"):
        shutil.copytree(root / "model_repository" / m, repo / m)
    (repo / "soak_ens" / "1").mkdir(parents=True)
    (repo / "soak_ens" / "config.pbtxt").write_text(ENSEMBLE)
    (repo / "acc_py" / "1").mkdir(parents=True)
    (repo / "acc_py" / "config.pbtxt").write_text(ACC_CONFIG)
    (repo / "acc_py" / "1" / "model.py").write_text(ACC_MODEL)


@dataclass(frozen=True)
class Failure:
    """One request that failed: when (seconds since the load began), on which client and
    protocol, for which model, with which words."""

    t_s: float
    client: int
    protocol: str
    model: str
    message: str


class WrongAnswer(Exception):
    """The server answered, with the wrong numbers."""


def _expected(model: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b if model in ("add_sub", "add_sub_py") else a + 2 * b


def _difference(model: str, got: np.ndarray, a: np.ndarray, b: np.ndarray) -> str:
    """What is wrong with an answer: its shape, or its first wrong element."""
    want = _expected(model, a, b)
    where = f"{model} for {a[0, 0]}, {b[0, 0]} (batch {a.shape[0]})"
    if got.shape != want.shape:
        return f"{where}: shape {got.shape}, expected {want.shape}: {got.ravel()[:8]}"
    k = int(np.argmax(got.ravel() != want.ravel()))
    return f"{where}: element {k} is {got.ravel()[k]}, expected {want.ravel()[k]}"


class _Grpc:
    """One gRPC client on its own connection; ``shm_key`` set: add_sub inputs go through a
    system shared-memory region of its own."""

    protocol = "grpc"

    def __init__(self, url: str, shm_key: str = "") -> None:
        self.url = url
        self.client = grpcclient.InferenceServerClient(
            url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.shm_key = shm_key
        self.region = ""
        self.handle: Any = None
        if shm_key:
            self.region = shm_key.strip("/")
            self.handle = shm.create_shared_memory_region(self.region, shm_key, 2 * 8 * 16 * 4)
            self.client.register_system_shared_memory(self.region, shm_key, 2 * 8 * 16 * 4)

    def infer(self, model: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        inputs = []
        use_shm = bool(self.shm_key) and model == "add_sub"
        if use_shm:
            shm.set_shared_memory_region(self.handle, [a, b])
        for i, (name, x) in enumerate((("INPUT0", a), ("INPUT1", b))):
            t = grpcclient.InferInput(name, list(x.shape), "FP32")
            if use_shm:
                t.set_shared_memory(self.region, x.nbytes, offset=i * a.nbytes)
            else:
                t.set_data_from_numpy(x)
            inputs.append(t)
        out = [grpcclient.InferRequestedOutput("OUTPUT0")]
        res = self.client.infer(model, inputs, outputs=out, client_timeout=60)
        return np.asarray(res.as_numpy("OUTPUT0"))

    def step(self, value: float, seq: int, start: bool, end: bool) -> float:
        x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[value]], np.float32))
        res = self.client.infer(
            "acc_py", [x], sequence_id=seq, sequence_start=start, sequence_end=end,
            client_timeout=60,
        )  # fmt: skip
        return float(res.as_numpy("OUTPUT")[0][0])

    def close(self) -> None:
        if self.shm_key:
            with contextlib.suppress(InferenceServerException):
                self.client.unregister_system_shared_memory(self.region)
            shm.destroy_shared_memory_region(self.handle)
        self.client.close()


class _Http:
    """One HTTP/JSON client on one keep-alive connection (reopened after a failure)."""

    protocol = "http"

    def __init__(self, url: str) -> None:
        self.host, port = url.rsplit(":", 1)
        self.port = int(port)
        self.conn: http.client.HTTPConnection | None = None

    def _post(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            self.conn.request(
                "POST", f"/v2/models/{model}/infer", json.dumps(body),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            r = self.conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
        return dict(json.loads(data))

    def infer(self, model: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        body = {
            "inputs": [
                {"name": n, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
                for n, x in (("INPUT0", a), ("INPUT1", b))
            ],
            "outputs": [{"name": "OUTPUT0"}],
        }
        out = self._post(model, body)["outputs"][0]
        return np.array(out["data"], np.float32).reshape(out["shape"])

    def step(self, value: float, seq: int, start: bool, end: bool) -> float:
        body = {
            "parameters": {"sequence_id": seq, "sequence_start": start, "sequence_end": end},
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [value]}],
        }
        return float(self._post("acc_py", body)["outputs"][0]["data"][0])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Clients:
    """``n`` client threads (see the module docstring) until ``stop``."""

    def __init__(self, grpc_url: str, http_url: str, n: int, seed: int, shm_prefix: str) -> None:
        self.ok = 0
        self.by_model = dict.fromkeys(MODELS, 0)
        self.failures: list[Failure] = []
        self.wrong: list[str] = []
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._run, args=(i, grpc_url, http_url, seed, shm_prefix), daemon=True
            )
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def _client(self, i: int, grpc_url: str, http_url: str, shm_prefix: str) -> _Grpc | _Http:
        if i % 2:
            return _Http(http_url)
        return _Grpc(grpc_url, f"{shm_prefix}{i}" if i % 8 == 0 else "")

    def _run(self, i: int, grpc_url: str, http_url: str, seed: int, shm_prefix: str) -> None:
        rng = random.Random(seed * 1000 + i)
        client = self._client(i, grpc_url, http_url, shm_prefix)
        seq_base = (i + 1) * 10_000_000
        n = 0
        try:
            while not self._stop.is_set():
                model = rng.choice(MODELS)
                n += 1
                try:
                    if model == "acc_py":
                        self._sequence(client, seq_base + n, rng)
                    else:
                        b = rng.randint(1, 8)
                        x = np.full((b, 16), rng.randint(0, 100), np.float32)
                        y = np.full((b, 16), rng.randint(0, 100), np.float32)
                        got = client.infer(model, x, y)
                        if not np.array_equal(got, _expected(model, x, y)):
                            raise WrongAnswer(_difference(model, got, x, y))
                except WrongAnswer as e:
                    with self._lock:
                        self.wrong.append(f"t={time.monotonic() - self.t0:.1f}s {e}")
                    continue
                except Exception as e:  # noqa: BLE001 - every failure is recorded and judged
                    msg = e.message() if isinstance(e, InferenceServerException) else repr(e)
                    status = e.status() if isinstance(e, InferenceServerException) else ""
                    with self._lock:
                        self.failures.append(
                            Failure(
                                round(time.monotonic() - self.t0, 2),
                                i,
                                client.protocol,
                                model,
                                f"{status} {msg}"[:300],
                            )
                        )
                    time.sleep(0.05)
                    continue
                with self._lock:
                    self.ok += 1 if model != "acc_py" else SEQUENCE_LENGTH
                    self.by_model[model] += 1 if model != "acc_py" else SEQUENCE_LENGTH
        finally:
            client.close()

    def _sequence(self, client: _Grpc | _Http, seq: int, rng: random.Random) -> None:
        total = 0.0
        for k in range(SEQUENCE_LENGTH):
            v = float(rng.randint(1, 9))
            total += v
            got = client.step(v, seq, k == 0, k == SEQUENCE_LENGTH - 1)
            if got != total:
                raise WrongAnswer(f"acc_py sequence {seq} step {k}: {got} != {total}")

    def stop(self, timeout_s: float = 120) -> int:
        """Stop; returns how many threads did not finish in time (hung clients)."""
        self._stop.set()
        end = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        return sum(t.is_alive() for t in self._threads)
