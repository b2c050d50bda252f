"""How a python model's errors are counted, side by side with the real Triton 2.51.

python_be.cc reports every request of a batch as a success (``PbMetricReporter``) unless
``ProcessRequests`` itself failed: an error the model *returns* as a request's response
(``InferenceResponse(error=...)``) is answered as an error but counted as executed
(``success``, ``inference_count``, ``nv_inference_request_success``); an ``execute`` that
*raises* fails the whole batch (``fail``, ``nv_inference_request_failure``).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 300000 preferred_batch_size: [ 2 ] }
"""
MODEL = """
import triton_python_backend_utils as pb_utils


def check(x):
    if int(x.reshape(-1)[0]) == -2:
        raise RuntimeError("boom")


class TritonPythonModel:
    def initialize(self, args):
        self.numbers = pb_utils.MetricFamily(
            name="r13_err_numbers", description="n", kind=pb_utils.MetricFamily.GAUGE
        )
        for i, v in enumerate([5.0, 100000.0, 0.1 + 0.2, 1e16, 2.0**60, 1 / 3, 1e-5]):
            self.numbers.Metric(labels={"i": str(i)}).set(v)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            check(x)
            if int(x.reshape(-1)[0]) < 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
SIDE_BY_SIDE_MODELS = {"err_py": PythonModel(CONFIG, MODEL)}
"""err_py: answers INPUT0, a returned error for a negative one, raises for -2. It batches
two requests sent together (a 300 ms delay, preferred batch size 2). Its custom gauge family
``r13_err_numbers`` holds a few values whose text forms differ between number formats.
tests/e2e/conftest.py's ``shared_side_by_side`` serves it."""


FAMILIES = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count")


def _counts(server: ServerProcess | RealTriton) -> dict[str, float]:
    """err_py's statistics counts (success, fail, queue, compute_infer, inference_count,
    execution_count) and the sums of its ``FAMILIES`` series."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/err_py/stats") as r:
        stats = json.load(r)["model_stats"][0]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    found: dict[str, float] = {
        k: stats["inference_stats"][k].get("count", 0)
        for k in ("success", "fail", "queue", "compute_infer")
    }
    found["inference_count"] = stats["inference_count"]
    found["execution_count"] = stats["execution_count"]
    for family in FAMILIES:
        pattern = rf'^{family}\{{[^}}]*model="err_py"[^}}]*\}} (\S+)$'
        found[family] = sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))
    return found


def _send(server: ServerProcess | RealTriton, values: list[int]) -> list[str]:
    """One call per value, all at once (so a batch holds them): each answer or error."""

    def one(v: int) -> str:
        t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
        t.set_data_from_numpy(np.array([[v]], np.int32))
        with grpcclient.InferenceServerClient(server.url) as c:
            try:
                return str(c.infer("err_py", [t]).as_numpy("OUTPUT0").tolist())
            except InferenceServerException as e:
                return f"{e.status()}: {e.message().splitlines()[0]}"

    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(one, values))


def _delta(server: ServerProcess | RealTriton, values: list[int]) -> tuple[list[str], dict]:
    """The answers to ``values`` and what they changed in ``_counts`` (only what changed)."""
    before = _counts(server)
    answers = _send(server, values)
    # NOTE: both report a batch's statistics after its answers are sent
    deadline = time.monotonic() + 5
    after = _counts(server)
    while after["success"] + after["fail"] < before["success"] + before["fail"] + len(values):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        after = _counts(server)
    return answers, {k: after[k] - before[k] for k in after if after[k] != before[k]}


RETURNED = {
    "success": 1,
    "queue": 1,
    "compute_infer": 1,
    "inference_count": 1,
    "execution_count": 1,
    "nv_inference_request_success": 1.0,
    "nv_inference_count": 1.0,
}


def test_a_returned_error_counts_as_executed(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    for name, server in shared_side_by_side.items():
        assert _delta(server, [-1]) == (["StatusCode.INTERNAL: negative"], RETURNED), name


def test_a_returned_error_in_a_batch_counts_as_executed(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    expected = {k: 2 * v for k, v in RETURNED.items()}
    expected["execution_count"] = 1
    for name, server in shared_side_by_side.items():
        assert _delta(server, [-1, 5]) == (["StatusCode.INTERNAL: negative", "[[5]]"], expected), (
            name
        )


def test_an_execute_that_raises_counts_as_failed(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    expected = {"fail": 1, "execution_count": 1, "nv_inference_request_failure": 1.0}
    for name, server in shared_side_by_side.items():
        answers, delta = _delta(server, [-2])
        assert answers == [
            "StatusCode.INTERNAL: Failed to process the request(s) for model 'err_py_0', "
            "message: RuntimeError: boom"
        ], name
        assert delta == expected, name


def _raised(server: ServerProcess | RealTriton, model: str) -> str:
    """The whole message of a call to ``model`` with INPUT0 -2 (its execute raises)."""
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[-2]], np.int32))
    with (
        grpcclient.InferenceServerClient(server.url) as c,
        pytest.raises(InferenceServerException) as e,
    ):
        c.infer(model, [t])
    return e.value.message()


def _line(text: str) -> int:
    """The line of err_py's model.py that is ``text`` (indentation aside)."""
    return next(i for i, src in enumerate(MODEL.splitlines(), 1) if src.strip() == text)


def test_an_execute_that_raises_names_the_models_frames(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    # the stub's words (pybind11's error_already_set::what()): "\n\nAt:\n", then one line
    # per frame of the model's code, the innermost first, up to execute
    raised, called = _line('raise RuntimeError("boom")'), _line("check(x)")
    frames = [f"err_py/1/model.py({raised}): check\n", f"err_py/1/model.py({called}): execute\n"]
    for name, server in shared_side_by_side.items():
        first, at = _raised(server, "err_py").split("\n\nAt:\n")
        assert first == (
            "Failed to process the request(s) for model 'err_py_0', message: RuntimeError: boom"
        ), name
        lines = at.split("  ")[1:]
        assert [line.endswith(f) for line, f in zip(lines, frames, strict=True)] == [True] * 2, (
            name,
            at,
        )


def test_metric_values_are_written_as_triton_writes_them(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    """prometheus-cpp in 2.51 writes a value with ``%.16g``: whole numbers without ``.0``,
    no exponent below 1e16, 16 significant digits."""
    numbers = ("5", "100000", "0.3", "1e+16", "1.152921504606847e+18", "0.3333333333333333")
    expected = {f'r13_err_numbers{{i="{i}"}} {v}' for i, v in enumerate((*numbers, "1e-05"))}
    expected.add('nv_inference_request_failure{model="err_py",reason="REJECTED",version="1"} 0')
    for name, server in sorted(shared_side_by_side.items()):  # Triton first: its half passes
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            lines = set(r.read().decode().splitlines())
        assert expected - lines == set(), name
