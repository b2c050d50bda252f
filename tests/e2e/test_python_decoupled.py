"""End to end: decoupled python models through gRPC ``ModelStreamInfer`` (tritonclient).

The session's shared triton-mp (tests/e2e/conftest.py's ``shared_side_by_side``), serving
the project's ``repeat_int32`` (Triton's
decoupled "repeat" example interface), ``modes_py`` (a decoupled model written here whose
``MODE`` input picks one way of using the response sender: many responses, the last one
final, an error mid-stream, execute raising, execute returning a list, no sender at all,
responses from a thread after execute returned, a second send after the final one) and the
ordinary ``add_sub_py``. Where the peers are installed (``.peers/``, see
bench/README.md) the shared real Triton serves the same models and the answers are
compared; those tests skip cleanly otherwise.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


MODES_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODES_MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def out(i):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            if mode == 3:
                raise pb_utils.TritonModelException("mode three raises")
            if mode == 4:
                return [out(0)]
            if mode == 5:
                continue
            sender = request.get_response_sender()
            if mode == 0:
                for i in range(n):
                    sender.send(out(i))
                sender.send(flags=FINAL)
            elif mode == 1:
                for i in range(n):
                    sender.send(out(i), flags=FINAL if i == n - 1 else 0)
            elif mode == 2:
                sender.send(out(0))
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("mid-stream", pb_utils.TritonError.INVALID_ARG)))
                sender.send(out(2))
                sender.send(flags=FINAL)
            elif mode == 6:
                def later(sender=sender, n=n):
                    time.sleep(0.05)
                    for i in range(n):
                        sender.send(out(i))
                    sender.send(flags=FINAL)
                threading.Thread(target=later, daemon=True).start()
            elif mode == 7:
                sender.send(out(0))
                raise pb_utils.TritonModelException("mode seven raises after one response")
            elif mode == 8:
                sender.send(out(0), flags=FINAL)
                try:
                    sender.send(out(1))
                except pb_utils.TritonModelException as e:
                    pb_utils.Logger.log_info("SECOND SEND: " + e.message())
        return None
"""

SLEEP_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 4 kind: KIND_CPU } ]
"""
SLEEP_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(int(ms[0]) / 1000)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return out
"""
"""A non-decoupled model whose execute sleeps MS milliseconds; four instances, so a later
request with a shorter sleep completes before an earlier one."""

Outcome = dict[str, list[tuple[int | None, bool]]]
"""Per request id: (OUT value or None for an empty response, triton_final_response)."""


SIDE_BY_SIDE_MODELS = {
    "repeat_int32": PROJECT_REPOSITORY / "repeat_int32",
    "add_sub_py": PROJECT_REPOSITORY / "add_sub_py",
    "modes_py": PythonModel(MODES_CONFIG, MODES_MODEL),
    "sleep_py": PythonModel(SLEEP_CONFIG, SLEEP_MODEL),
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them."""


@pytest.fixture(scope="module")
def server(shared_side_by_side: dict[str, ServerProcess | RealTriton]) -> ServerProcess:
    ours = shared_side_by_side["triton-mp"]
    assert isinstance(ours, ServerProcess)
    return ours


@pytest.fixture(scope="module")
def triton_url(shared_side_by_side: dict[str, ServerProcess | RealTriton]) -> str:
    """The real Triton (python backend) serving the same models, or a skip."""
    return urls_of(shared_side_by_side, "triton")[0]


def _repeat_inputs(values: list[int], delays: list[int], wait: int) -> list[grpcclient.InferInput]:
    arrays = (
        ("IN", np.array(values, np.int32), "INT32"),
        ("DELAY", np.array(delays, np.uint32), "UINT32"),
        ("WAIT", np.array([wait], np.uint32), "UINT32"),
    )
    out = []
    for name, arr, dtype in arrays:
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def _modes_inputs(mode: int, n: int = 3) -> list[grpcclient.InferInput]:
    out = []
    for name, value in (("MODE", mode), ("N", n)):
        t = grpcclient.InferInput(name, [1], "INT32")
        t.set_data_from_numpy(np.array([value], np.int32))
        out.append(t)
    return out


def _stream(
    url: str,
    requests: list[tuple[str, str, list[grpcclient.InferInput], bool]],
    output: str = "OUT",
) -> tuple[Outcome, list[str]]:
    """Send (model, id, inputs, enable_empty_final_response) on one stream, close it, and
    collect every response (the server ends the stream after every request's last one)."""
    got: Outcome = collections.defaultdict(list)
    errors: list[str] = []
    lock = threading.Lock()

    def callback(result: grpcclient.InferResult | None, error: object) -> None:
        with lock:
            if error is not None:
                errors.append(
                    error.message() if isinstance(error, InferenceServerException) else str(error)
                )
                return
            assert result is not None
            resp = result.get_response()
            arr = result.as_numpy(output)
            final = resp.parameters["triton_final_response"].bool_param
            got[resp.id].append((None if arr is None else int(arr.reshape(-1)[0]), final))

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=callback)
        for model, rid, inputs, empty_final in requests:
            client.async_stream_infer(
                model, inputs, request_id=rid, enable_empty_final_response=empty_final
            )
        client.stop_stream()
    finally:
        client.close()
    return dict(got), errors


MODES_SENT = [0, 1, 2, 3, 4, 6, 7, 8]
"""Modes whose behaviour Triton and triton-mp share (mode 5 differs: see its test)."""
MODES_EXPECTED: Outcome = {
    "0": [(0, False), (1, False), (2, False), (None, True)],
    "1": [(0, False), (1, False), (2, True)],
    "2": [(0, False), (2, False), (None, True)],
    "6": [(0, False), (1, False), (2, False), (None, True)],
    "7": [(0, False)],
    "8": [(0, True)],
}
MODES_ERRORS = sorted(
    [
        "mid-stream",
        "Failed to process the request(s) for model 'modes_py_0_0', message: "
        "TritonModelException: mode three raises",
        "Failed to process the request(s) for model 'modes_py_0_0', message: Python model "
        "'modes_py_0_0' is using the decoupled mode and the execute function must return None.",
        "Failed to process the request(s) for model 'modes_py_0_0', message: "
        "TritonModelException: mode seven raises after one response",
    ]
)


def _modes_requests() -> list[tuple[str, str, list[grpcclient.InferInput], bool]]:
    return [("modes_py", str(m), _modes_inputs(m), True) for m in MODES_SENT]


def _raised_at(text: str) -> str:
    """The traceback section the python backend's stub adds to an error ``execute`` raised
    (pybind11's ``error_already_set::what()``) on MODES_MODEL's line holding ``text``."""
    lines = MODES_MODEL.splitlines()
    line = next(i for i, src in enumerate(lines, 1) if text in src)
    return f"/modes_py/1/model.py({line}): execute\n"


def test_response_sender_modes(server: ServerProcess) -> None:
    got, errors = _stream(server.url, _modes_requests())
    assert got == MODES_EXPECTED
    assert sorted(e.split("\n\nAt:\n")[0] for e in errors) == MODES_ERRORS
    at = sorted(e.split("\n\nAt:\n  ")[1] for e in errors if "\n\nAt:\n" in e)
    lines = [_raised_at("mode three raises"), _raised_at("mode seven raises")]
    assert [a.endswith(line) for a, line in zip(at, lines, strict=True)] == [True, True], at
    # NOTE: the model logs after its final response left, so the client may see the stream
    # end first: wait for the line.
    line = "SECOND SEND: Unable to send response. Response sender has been closed."
    deadline = time.monotonic() + 30
    while line not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert line in server.log()


def test_same_answers_as_triton(server: ServerProcess, triton_url: str) -> None:
    ours = _stream(server.url, _modes_requests())
    theirs = _stream(triton_url, _modes_requests())
    assert ours[0] == theirs[0]
    assert sorted(ours[1]) == sorted(theirs[1])  # the stub's tracebacks too
    repeat = [
        ("repeat_int32", "a", _repeat_inputs([4, 2, 0, 1], [1, 2, 3, 4], 5), True),
        ("repeat_int32", "b", _repeat_inputs([], [], 0), True),
        ("repeat_int32", "c", _repeat_inputs([7], [0], 0), False),
        ("repeat_int32", "d", _repeat_inputs([1, 2], [1], 0), False),
    ]
    ours = _stream(server.url, repeat)
    theirs = _stream(triton_url, repeat)
    assert ours == theirs
    assert ours[0]["a"] == [(4, False), (2, False), (0, False), (1, False), (None, True)]


def test_a_model_that_never_asks_for_its_sender_ends_the_request(server: ServerProcess) -> None:
    """Triton would leave the client waiting forever; triton-mp ends the request."""
    got, errors = _stream(server.url, [("modes_py", "5", _modes_inputs(5), True)])
    assert got == {"5": [(None, True)]}
    assert errors == []
    got, _ = _stream(server.url, [("modes_py", "5", _modes_inputs(5), False)])
    assert got == {}


def test_repeat_many_zero_and_one_response(server: ServerProcess) -> None:
    got, errors = _stream(
        server.url,
        [
            ("repeat_int32", "many", _repeat_inputs(list(range(20)), [0] * 20, 0), False),
            ("repeat_int32", "zero", _repeat_inputs([], [], 0), False),
            ("repeat_int32", "zero-empty", _repeat_inputs([], [], 0), True),
            ("repeat_int32", "one", _repeat_inputs([42], [0], 0), True),
        ],
    )
    assert errors == []
    assert got["many"] == [(i, False) for i in range(20)]
    assert "zero" not in got
    assert got["zero-empty"] == [(None, True)]
    assert got["one"] == [(42, False), (None, True)]
    got, _ = _stream(
        server.url,
        [("repeat_int32", "idx", _repeat_inputs([9, 8, 7], [0, 0, 0], 0), False)],
        output="IDX",
    )
    assert got["idx"] == [(0, False), (1, False), (2, False)]


def test_one_instance_serves_overlapping_requests(server: ServerProcess) -> None:
    """execute returns after WAIT while the responses keep coming: with one instance, the
    responses of three requests interleave and the whole takes about one request's time."""
    t0 = time.monotonic()
    got, errors = _stream(
        server.url,
        [("repeat_int32", str(k), _repeat_inputs([k] * 5, [200] * 5, 0), False) for k in range(3)],
    )
    elapsed = time.monotonic() - t0
    assert errors == []
    assert got == {str(k): [(k, False)] * 5 for k in range(3)}
    assert elapsed < 2.9, f"the three requests ran one after another ({elapsed:.2f} s)"


def test_concurrent_streams_get_their_own_responses(server: ServerProcess) -> None:
    results: dict[int, Outcome] = {}

    def one(k: int) -> None:
        reqs = [
            ("repeat_int32", f"{k}-{j}", _repeat_inputs([k * 100 + j] * 4, [5] * 4, 1), True)
            for j in range(3)
        ]
        got, errors = _stream(server.url, reqs)
        assert errors == []
        results[k] = got

    threads = [threading.Thread(target=one, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(6))
    for k, got in results.items():
        assert got == {f"{k}-{j}": [(k * 100 + j, False)] * 4 + [(None, True)] for j in range(3)}


def test_cancelled_stream_reaches_the_model(server: ServerProcess) -> None:
    """Closing the stream with cancel_requests=True: the model sees is_cancelled() and stops
    early (its remaining responses are dropped), and the server goes on."""
    before = server.log().count("cancelled after")
    client = grpcclient.InferenceServerClient(server.url)
    seen: queue.Queue[object] = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: seen.put(error or result))
        client.async_stream_infer(
            "repeat_int32", _repeat_inputs(list(range(100)), [50] * 100, 0), request_id="long"
        )
        for _ in range(2):
            assert not isinstance(seen.get(timeout=30), Exception)
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    deadline = time.monotonic() + 30
    while server.log().count("cancelled after") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.log().count("cancelled after") == before + 1
    got, _ = _stream(server.url, [("repeat_int32", "after", _repeat_inputs([1], [0], 0), True)])
    assert got == {"after": [(1, False), (None, True)]}


def test_modelinfer_refuses_decoupled_models(server: ServerProcess) -> None:
    client = server.client()
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer("repeat_int32", _repeat_inputs([1], [0], 0))
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert e.value.message() == (
            "ModelInfer RPC doesn't support models with decoupled transaction policy"
        )
    finally:
        client.close()


def test_ordinary_models_on_the_stream_carry_the_final_flag(server: ServerProcess) -> None:
    a = np.ones((1, 16), np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = grpcclient.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    got, errors = _stream(server.url, [("add_sub_py", "x", inputs, True)], output="OUTPUT0")
    assert errors == []
    assert got == {"x": [(2, True)]}


def test_statistics_count_decoupled_requests(server: ServerProcess) -> None:
    client = server.client()
    try:
        before = client.get_inference_statistics("repeat_int32", as_json=True)
        _stream(
            server.url,
            [("repeat_int32", str(k), _repeat_inputs([k], [0], 0), False) for k in range(5)],
        )
        deadline = time.monotonic() + 10
        while True:
            after = client.get_inference_statistics("repeat_int32", as_json=True)
            done = int(after["model_stats"][0].get("inference_count", 0)) - int(
                before["model_stats"][0].get("inference_count", 0)
            )
            if done >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert done == 5
    finally:
        client.close()


def _ms_inputs(ms: int) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("MS", [1], "INT32")
    t.set_data_from_numpy(np.array([ms], np.int32))
    return [t]


def _arrival_order(url: str) -> list[str]:
    """Ids as the stream's responses and errors arrived: non-decoupled ``sleep_py``
    requests whose sleeps shrink (a later one completes first), a refusal (unknown model)
    between them, and two decoupled ``repeat_int32`` requests, the slow one first."""
    order: list[str] = []
    lock = threading.Lock()

    def callback(result: grpcclient.InferResult | None, error: object) -> None:
        with lock:
            if result is not None:
                order.append(result.get_response().id)
            else:
                message = error.message() if isinstance(error, InferenceServerException) else ""
                order.append("refused" if "nope" in message else f"error: {error}")

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=callback)
        for rid, ms in (("s0", 600), ("s1", 400)):
            client.async_stream_infer("sleep_py", _ms_inputs(ms), request_id=rid)
        client.async_stream_infer("nope", _ms_inputs(0), request_id="r")
        for rid, ms in (("s2", 200), ("s3", 0)):
            client.async_stream_infer("sleep_py", _ms_inputs(ms), request_id=rid)
        client.async_stream_infer(
            "repeat_int32", _repeat_inputs([1], [1500], 0), request_id="dslow"
        )
        client.async_stream_infer("repeat_int32", _repeat_inputs([2], [0], 0), request_id="dfast")
        client.stop_stream()
    finally:
        client.close()
    return order


def test_non_decoupled_responses_leave_in_request_order(server: ServerProcess) -> None:
    """Triton's stream handler writes a non-decoupled model's responses (and refusals) in
    request order; a decoupled model's leave as they complete."""
    order = _arrival_order(server.url)
    assert [i for i in order if not i.startswith("d")] == ["s0", "s1", "refused", "s2", "s3"]
    assert [i for i in order if i.startswith("d")] == ["dfast", "dslow"]


def test_stream_order_as_triton(server: ServerProcess, triton_url: str) -> None:
    ours, theirs = _arrival_order(server.url), _arrival_order(triton_url)
    assert [i for i in ours if not i.startswith("d")] == [
        i for i in theirs if not i.startswith("d")
    ]
    assert [i for i in theirs if i.startswith("d")] == ["dfast", "dslow"]
