"""A batch's answers to one frontend in one message (``workers.tensors.answer_batch``; the C
answer writer, ``workers/native/answer_writer.cc``, where it is built), end to end with
tritonclient over HTTP (the frontend's Python reader) and gRPC (the native answer reader).

A batching python model whose responses carry a fixed-size output, a BYTES output of every
element length class, an empty output and response parameters, held for 20 ms per batch so
that concurrent calls batch: from 8 threads per protocol every answer is the call's own, with
its parameters; batches held several requests (execution count below inference count).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, counted, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 16
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "EMPTY", data_type: TYPE_INT64, dims: [ -1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [{ count: 1, kind: KIND_CPU }]
"""
MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            seed = int(x[0, 0])
            text = ("t" * (seed % 300)).encode()
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x + 1),
                 pb_utils.Tensor("TEXT", np.array([[text]], dtype=np.object_)),
                 pb_utils.Tensor("EMPTY", np.zeros((1, 0), np.int64))],
                parameters={"seed": seed, "odd": bool(seed % 2)} if seed % 3 else None))
        return out
"""
THREADS = 8
CALLS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("grouped") / "repo"
    write_python_model(repo, "grouped_py", CONFIG, MODEL)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _check(res: object, seed: int, params: dict[str, object]) -> None:
    x = np.full((1, 4), seed, np.float32)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 1)  # type: ignore[attr-defined]
    assert res.as_numpy("TEXT").tolist() == [[b"t" * (seed % 300)]]  # type: ignore[attr-defined]
    assert res.as_numpy("EMPTY").shape == (1, 0)  # type: ignore[attr-defined]
    assert params == ({"seed": seed, "odd": bool(seed % 2)} if seed % 3 else {})


def _grpc_call(client: grpcclient.InferenceServerClient, seed: int) -> None:
    x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.full((1, 4), seed, np.float32))
    res = client.infer("grouped_py", [x])
    got = res.get_response().parameters
    params: dict[str, object] = {
        k: (v.bool_param if v.WhichOneof("parameter_choice") == "bool_param" else v.int64_param)
        for k, v in got.items()
    }
    _check(res, seed, params)


def _http_call(client: httpclient.InferenceServerClient, seed: int) -> None:
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.full((1, 4), seed, np.float32), binary_data=True)
    res = client.infer("grouped_py", [x])
    _check(res, seed, dict(res.get_response().get("parameters", {})))


def test_concurrent_calls_get_their_own_answers_from_grouped_batches(
    server: ServerProcess,
) -> None:
    errors: list[BaseException] = []

    def run(t: int, proto: str) -> None:
        try:
            if proto == "grpc":
                g = server.client()
                for i in range(CALLS):
                    _grpc_call(g, t * 1000 + i * 7)
            else:
                h = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
                for i in range(CALLS):
                    _http_call(h, 500 + t * 1000 + i * 11)
                h.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=(t, proto))
        for t in range(THREADS)
        for proto in ("grpc", "http")
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, [str(e) for e in errors[:3]]
    total = 2 * THREADS * CALLS
    client = server.client()
    st = counted(
        lambda: client.get_inference_statistics("grouped_py").model_stats[0],
        lambda s: s.inference_stats.success.count >= total,
        f"{total} counted",
    )
    assert st.inference_stats.success.count == total
    assert st.execution_count < total / 2, json.dumps(str(st))
