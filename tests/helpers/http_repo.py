"""What the HTTP/REST end-to-end modules share: their repository and raw HTTP calls.

``http_repository``: add_sub (ONNX), bytes_py (BYTES in and out), sleep_py (sleeps as long as
it is told), a decoupled copy of add_sub and a model that fails to load. ``raw_http``: one raw
request (``http.client``) and its ``Reply``; ``as_proto``: an HTTP JSON answer as the gRPC
message; ``add_sub_inputs`` / ``grpc_error`` for the answers compared with gRPC's.
"""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import BYTES_PY_CONFIG, BYTES_PY_MODEL, copy_models, write_python_model
from tests.helpers.server import (
    PROJECT_REPOSITORY,
    ServerProcess,
)

SLEEP_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SLEEP_MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "SECONDS").as_numpy()
            if x.size:
                time.sleep(float(x.max()))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


def sleep_repo(repo: Path) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    write_python_model(repo, "sleep_py", SLEEP_CONFIG, SLEEP_MODEL)
    return repo


def http_repository(root: Path) -> Path:
    """The modules' model repository, written under ``root``."""
    repo = copy_models(root, "add_sub")
    write_python_model(repo, "bytes_py", BYTES_PY_CONFIG, BYTES_PY_MODEL)
    sleep_repo(repo)
    shutil.copytree(PROJECT_REPOSITORY / "add_sub", repo / "decoupled_add_sub")
    cfg = (repo / "decoupled_add_sub" / "config.pbtxt").read_text()
    (repo / "decoupled_add_sub" / "config.pbtxt").write_text(
        cfg.replace('name: "add_sub"', "") + "model_transaction_policy { decoupled: true }\n"
    )
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: [\n')
    return repo


class Reply:
    """A raw HTTP answer."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        # NOTE: 2.51 labels the JSON errors of health, readiness, unmatched paths and early
        # inference refusals text/plain (test_s12_http_headers holds which).
        assert self.headers.get("content-type") in ("application/json", "text/plain"), self.headers
        doc = self.json()
        assert list(doc) == ["error"], doc
        return str(doc["error"])


def raw_http(
    server: ServerProcess,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def as_proto(doc: Any, message: Any) -> Any:
    """An HTTP JSON answer as the gRPC proto (fails if it is not that message's JSON)."""
    return json_format.ParseDict(doc, message, ignore_unknown_fields=False)


def add_sub_inputs(mod: Any, a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[Any]:
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = mod.InferInput(name, list(x.shape), "FP32")
        if mod is httpclient:
            i.set_data_from_numpy(x, binary_data=binary)
        else:
            i.set_data_from_numpy(x)
        out.append(i)
    return out


def grpc_error(gc: grpcclient.InferenceServerClient, call: Callable[[], Any]) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.message())
