"""Repository control over HTTP for the side-by-side reload tests: a config in Triton's JSON
form written as config.pbtxt, RepositoryModelLoad with ``config`` / ``file:`` overrides
(KServe's repository extension, Triton's model_repository.md "Load"), and the running-sum
sequence model those tests reload.

Every function takes the server's HTTP address (``host:port``), so it serves triton-mp's
``ServerProcess`` and the real Triton's ``RealTriton`` alike."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

SEQ_START = {"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}
SEQ_CORRID = {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}


def seq_sum_config(outputs: tuple[str, ...] = ("OUTPUT0",), count: int = 1) -> dict:
    """A sequence model's config (Oldest, numeric CORRID, START control, INT32 [1] input
    INPUT0, one INT32 [1] output per name in ``outputs``), ``count`` CPU instances."""
    return {
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": n, "data_type": "TYPE_INT32", "dims": [1]} for n in outputs],
        "instance_group": [{"count": count, "kind": "KIND_CPU"}],
        "sequence_batching": {
            "max_sequence_idle_microseconds": 60000000,
            "oldest": {"max_candidate_sequences": 4},
            "control_input": [
                {"name": "START", "control": [SEQ_START]},
                {"name": "CORRID", "control": [SEQ_CORRID]},
            ],
        },
    }


def seq_sum_source(with_pid: bool = False) -> str:
    """model.py of ``seq_sum_config``: OUTPUT0 is each sequence's running sum of INPUT0, kept in
    its instance (START resets it); ``with_pid`` adds PID, the instance's process id."""
    pid_lines = (
        '            pid = pb_utils.Tensor("PID", np.array([[os.getpid()]], np.int32))\n'
        if with_pid
        else "            pid = None\n"
    )
    return f"""
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {{}}

    def execute(self, requests):
        out = []
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy().reshape(-1)[0]
            key = int(pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().reshape(-1)[0])
            self.sums[key] = (0 if start else self.sums.get(key, 0)) + x
            y = pb_utils.Tensor("OUTPUT0", np.array([[self.sums[key]]], np.int32))
{pid_lines}            out.append(pb_utils.InferenceResponse([y] + ([pid] if pid else [])))
        return out
"""


def config_pbtxt(config: dict) -> str:
    """``config`` (Triton's JSON form, the fields these tests use) as a config.pbtxt."""

    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{ " + " ".join(f"{k}: {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[ " + ", ".join(value(x) for x in v) + " ]"
        if isinstance(v, str) and (v.startswith(("TYPE_", "KIND_", "CONTROL_"))):
            return v
        return json.dumps(v)

    return "\n".join(f"{k}: {value(v)}" for k, v in config.items()) + "\n"


def post(http_url: str, path: str, body: object, timeout_s: float = 120) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``path``: (HTTP status, the answer's bytes), errors included."""
    req = urllib.request.Request(
        f"http://{http_url}{path}", json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def post_json(http_url: str, path: str, body: object, timeout_s: float = 120) -> tuple[int, object]:
    """``post``, the answer decoded as JSON (None for an empty one)."""
    status, text = post(http_url, path, body, timeout_s)
    return status, json.loads(text) if text else None


def load_with(
    http_url: str, model: str, config: dict | str | None = None, source: str | None = None
) -> int:
    """RepositoryModelLoad of ``model``: from the repository (no ``config``), or with
    ``config`` (a dict is sent as JSON) and ``source`` as its ``file:1/model.py``. Returns the
    HTTP status."""
    params: dict[str, str] = {}
    if config is not None:
        params["config"] = config if isinstance(config, str) else json.dumps(config)
    if source is not None:
        params["file:1/model.py"] = base64.b64encode(source.encode()).decode()
    body = {"parameters": params} if params else {}
    return post(http_url, f"/v2/repository/models/{model}/load", body)[0]
