"""Limits end to end: a request larger than the shared-memory tensor budget fails alone,
with RESOURCE_EXHAUSTED and a message that names the flag; the server keeps serving."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.fault_models import write_faulty_model
from tests.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BUDGET_BYTES = 2 << 20


def _input(n: int) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [n], "FP32")
    x.set_data_from_numpy(np.arange(n, dtype=np.float32))
    return [x]


def test_a_request_over_the_arena_budget_fails_alone_with_resource_exhausted(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = tmp_path / "repo"
    write_faulty_model(repo, "echo_py", "none", dims="-1")
    server = start_server(repo, "--arena-budget-bytes", str(BUDGET_BYTES))
    client = server.client()
    small = 64 << 10  # 256 KiB of FP32
    res = client.infer("echo_py", _input(small))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), np.arange(small, dtype=np.float32))

    big = (3 << 20) // 4  # 3 MiB of FP32
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo_py", _input(big))
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert f"exceed the {BUDGET_BYTES}-byte" in e.value.message()
    assert "--arena-budget-bytes" in e.value.message()

    body = np.zeros(big, np.float32).tobytes()
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[%d],'
        b'"parameters":{"binary_data_size":%d}}]}' % (big, len(body))
    )
    r = requests.post(
        f"http://{server.http_url}/v2/models/echo_py/infer",
        data=header + body,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=60,
    )
    assert r.status_code == 400
    assert "--arena-budget-bytes" in r.json()["error"]

    # Nothing else noticed: the same client is answered at once.
    res = client.infer("echo_py", _input(small))
    assert res.as_numpy("OUTPUT0").shape == (small,)
    assert client.is_server_ready()
    client.close()
