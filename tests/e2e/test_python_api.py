"""End to end: the recent python-backend API, through tritonclient gRPC and HTTP.

Python models written here, served by the session's shared triton-mp and, where the peers
are installed (``.peers/``), the shared real Triton 2.51 (tests/e2e/conftest.py's
``shared_side_by_side``); the answers are
compared where 2.51 has the feature (each test says). Covered: response parameters
(``InferenceResponse(parameters=...)``) reaching the client over gRPC, HTTP and a decoupled
stream, upstream's validation messages, and a BLS response's ``parameters()`` from the
called model; ``request.is_cancelled()`` / ``response_sender.is_cancelled()`` turning true
inside a running ``execute`` (gRPC cancel, a client deadline, a stream closed with
``cancel_requests``), ``cancel()`` on a decoupled BLS iterator, and the model's
``is_ready()`` behind ModelReady and strict ServerReady.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.python_api_models import API_MODELS, write_api_models
from tests.helpers.server import ServerProcess, server_factory, wait_for, wait_queued
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


EXPECTED_PARAMS = {"flag": True, "count": 7, "name": "ok", "off": False}


SIDE_BY_SIDE_MODELS = {name: PythonModel(*model) for name, model in API_MODELS.items()}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them."""


@pytest.fixture(scope="module")
def server(shared_side_by_side: dict[str, ServerProcess | RealTriton]) -> ServerProcess:
    ours = shared_side_by_side["triton-mp"]
    assert isinstance(ours, ServerProcess)
    return ours


@pytest.fixture(scope="module")
def repo(server: ServerProcess) -> Path:
    """The shared repository: the models write there what they saw, the tests put their
    flag files there."""
    return server.repository


@pytest.fixture(scope="module")
def triton(shared_side_by_side: dict[str, ServerProcess | RealTriton]) -> tuple[str, str]:
    """The shared real Triton: (gRPC url, HTTP url), or a skip."""
    return urls_of(shared_side_by_side, "triton")


def _urls(server: ServerProcess, request: pytest.FixtureRequest, which: str) -> tuple[str, str]:
    if which == "triton-mp":
        return server.url, server.http_url
    result: tuple[str, str] = request.getfixturevalue("triton")
    return result


SERVERS = pytest.mark.parametrize("which", ["triton-mp", "triton"])
"""Run the test against both servers (the feature exists in Triton 2.51)."""
MP_ONLY = pytest.mark.parametrize("which", ["triton-mp"])
"""Upstream main has the feature, Triton 2.51 does not: triton-mp alone."""


def _mode(value: int, module: object = grpcclient) -> object:
    inp = module.InferInput("MODE", [1], "INT32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.array([value], np.int32))
    return inp


def _grpc_params(response: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, p in response.parameters.items():  # type: ignore[attr-defined]
        out[key] = getattr(p, p.WhichOneof("parameter_choice"))
    return out


# ---------------------------------------------------------------- response parameters
# NOTE: upstream main only: the python backend of Triton 2.51 has no ``parameters=`` on
# ``InferenceResponse`` ("incompatible constructor arguments"), so these run against
# triton-mp alone, with upstream main's behaviour and messages (pb_stub.cc
# PyParametersToJSON, http_server.cc FinalizeResponse).


@MP_ONLY
def test_response_parameters_reach_grpc_and_http_clients(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    grpc_url, http_url = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    h = httpclient.InferenceServerClient(http_url)
    try:
        result = g.infer("params_py", [_mode(0)])
        assert _grpc_params(result.get_response()) == EXPECTED_PARAMS
        assert result.as_numpy("OUT").tolist() == [0]
        body = h.infer("params_py", [_mode(0, httpclient)]).get_response()
        assert body["parameters"] == EXPECTED_PARAMS
        assert list(body).index("parameters") < list(body).index("outputs")
    finally:
        g.close()
        h.close()


@MP_ONLY
@pytest.mark.parametrize("mode", [4, 5, 6])
def test_response_parameter_ints_outside_int64_fail_the_response_as_upstreams_send(
    which: str, mode: int, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """The constructor takes any Python int (upstream checks only the type); the send refuses
    one TritonJson does not read as int64 (infer_response.cc: "Unsupported value type on
    parameters", INTERNAL), over gRPC and HTTP alike (before: gRPC UNKNOWN "Value out of
    range", HTTP sent the value)."""
    grpc_url, http_url = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    h = httpclient.InferenceServerClient(http_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            g.infer("params_py", [_mode(mode)])
        assert err.value.status() == "StatusCode.INTERNAL"
        assert err.value.message() == "Unsupported value type on parameters"
        with pytest.raises(InferenceServerException) as herr:
            h.infer("params_py", [_mode(mode, httpclient)])
        assert herr.value.status() == "500"
        assert herr.value.message() == "Unsupported value type on parameters"
        for edge_mode, edge in ((7, 2**63 - 1), (8, -(2**63))):
            answer = g.infer("params_py", [_mode(edge_mode)])
            assert _grpc_params(answer.get_response()) == {"big": edge}
            body = h.infer("params_py", [_mode(edge_mode, httpclient)]).get_response()
            assert body["parameters"] == {"big": edge}
    finally:
        g.close()
        h.close()


@MP_ONLY
@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (1, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        (2, "Expect parameters keys to have type str, found type <class 'int'>"),
        (3, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ],
)
def test_response_parameters_of_other_types_are_refused_with_upstreams_message(
    which: str, mode: int, message: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            g.infer("params_py", [_mode(mode)])
        assert message in err.value.message()
    finally:
        g.close()


@MP_ONLY
def test_decoupled_response_parameters_travel_with_each_stream_response(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    got: queue.Queue[object] = queue.Queue()
    g.start_stream(callback=lambda result, error: got.put(error or result))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([3], np.int32))
        g.async_stream_infer("params_dec_py", [n])
        seen = []
        for _ in range(3):
            item = got.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            params = _grpc_params(item.get_response())  # type: ignore[attr-defined]
            seen.append((params["index"], params["last"]))
        assert seen == [(0, False), (1, False), (2, True)]
    finally:
        g.stop_stream()
        g.close()


@MP_ONLY
def test_bls_response_exposes_the_called_models_parameters(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    _, http_url = _urls(server, request, which)
    h = httpclient.InferenceServerClient(http_url)
    try:
        result = h.infer("bls_params_py", [_mode(0, httpclient)])
        assert json.loads(result.as_numpy("PARAMS")[0]) == EXPECTED_PARAMS
    finally:
        h.close()


# ---------------------------------------------------------------- cancellation


def _seen(repo: Path, model: str, name: str, within_s: float = 5.0) -> bool:
    """Whether the model left ``seen/<name>`` within ``within_s`` seconds."""
    path = repo / model / "seen" / name
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def _ms(value: int) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("MS", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], np.int32))
    return inp


@SERVERS
def test_grpc_cancel_reaches_a_running_execute(
    which: str, repo: Path, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """tritonclient's CallContext.cancel() while the model runs: ``request.is_cancelled()``
    turns true inside ``execute`` (python_backend "Request Cancellation Handling")."""
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    got: queue.Queue[object] = queue.Queue()
    rid = f"{which}-cancel"
    try:
        ctx = g.async_infer(
            "cancel_py",
            [_ms(20000)],
            lambda result, error: got.put(error or result),
            request_id=rid,
        )
        time.sleep(1.0)
        started = time.monotonic()
        ctx.cancel()
        assert _seen(repo, "cancel_py", rid), "the model never saw is_cancelled()"
        assert time.monotonic() - started < 3.0
        error = got.get(timeout=10)
        assert isinstance(error, InferenceServerException)
        assert "CANCELLED" in str(error.status())
    finally:
        g.close()


@SERVERS
def test_grpc_deadline_cancels_a_running_execute(
    which: str, repo: Path, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """A client deadline (``client_timeout``) that passes during ``execute``: the gRPC
    call is cancelled, so ``request.is_cancelled()`` turns true."""
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    rid = f"{which}-deadline"
    try:
        with pytest.raises(InferenceServerException) as err:
            g.infer("cancel_py", [_ms(20000)], request_id=rid, client_timeout=1.0)
        assert "DEADLINE_EXCEEDED" in str(err.value.status())
        assert _seen(repo, "cancel_py", rid), "the model never saw is_cancelled()"
    finally:
        g.close()


@SERVERS
def test_closing_a_stream_cancels_a_decoupled_execute(
    which: str, repo: Path, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """``stop_stream(cancel_requests=True)`` while a decoupled model sends from inside
    ``execute``: ``response_sender.is_cancelled()`` and ``request.is_cancelled()`` turn
    true there."""
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    got: queue.Queue[object] = queue.Queue()
    rid = f"{which}-stream"
    g.start_stream(callback=lambda result, error: got.put(error or result))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([1000], np.int32))
        g.async_stream_infer("ticker_py", [n], request_id=rid)
        got.get(timeout=30)
        g.stop_stream(cancel_requests=True)
        assert _seen(repo, "ticker_py", f"{rid}-request")
    finally:
        g.close()


@MP_ONLY
def test_cancel_on_a_decoupled_bls_iterator_reaches_the_called_model(
    which: str, repo: Path, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """``iterator.cancel()`` (python_backend "Cancelling decoupled BLS requests", newer than
    Triton 2.51, whose iterator has no cancel()): the callee's ``is_cancelled()`` turns true
    inside its ``execute``; it ends the request and the iterator ends after the final
    response, having given only the responses sent before."""
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    rid = f"{which}-bls"
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([1000], np.int32))
        started = time.monotonic()
        count = int(g.infer("bls_cancel_py", [n], request_id=rid).as_numpy("COUNT")[0])
        assert 2 <= count < 100
        assert time.monotonic() - started < 10
        assert _seen(repo, "ticker_py", f"{rid}-request", within_s=1.0)
    finally:
        g.close()


@MP_ONLY
def test_an_http_client_closing_its_connection_cancels_a_running_execute(
    which: str, repo: Path, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """triton-mp's HTTP endpoint cancels the request of a client that disconnects
    (aiohttp ``handler_cancellation``); Triton's does not detect it, so triton-mp alone."""
    _, http_url = _urls(server, request, which)
    host, port = http_url.rsplit(":", 1)
    rid = f"{which}-http"
    body = json.dumps(
        {
            "id": rid,
            "inputs": [{"name": "MS", "datatype": "INT32", "shape": [1], "data": [20000]}],
        }
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = (
            f"POST /v2/models/cancel_py/infer HTTP/1.1\r\nHost: {http_url}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        wait_queued(server.url, "cancel_py", running=1)  # execute runs; now hang up
    assert _seen(repo, "cancel_py", rid), "the model never saw is_cancelled()"


# ---------------------------------------------------------------- is_ready()
# NOTE: upstream main only (python_backend #430, 2026-03): Triton 2.51 never calls
# is_ready(), so these run against triton-mp alone, as upstream main behaves
# (TRITONBACKEND_ModelInstanceReady, server.cc ModelIsReady / strict IsReady).


def _readiness(server: ServerProcess, model: str) -> tuple[bool, bool, bool]:
    """(gRPC ModelReady, HTTP model ready, HTTP server ready) of ``model``."""
    g = grpcclient.InferenceServerClient(server.url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        return g.is_model_ready(model), h.is_model_ready(model), h.is_server_ready()
    finally:
        g.close()
        h.close()


@contextlib.contextmanager
def _flag(repo: Path, model: str, name: str) -> Iterator[None]:
    path = repo / model / name
    path.touch()
    try:
        yield
    finally:
        path.unlink()


def _calls(repo: Path, model: str) -> int:
    path = repo / model / "calls"
    return len(path.read_text()) if path.exists() else 0


@MP_ONLY
@pytest.mark.parametrize("model", ["ready_py", "ready_async_py"])
def test_is_ready_is_asked_on_every_readiness_check(
    which: str, model: str, repo: Path, server: ServerProcess
) -> None:
    """Each ModelReady asks every instance once (two here); False makes the model and
    (strict readiness) the server not ready while inference still runs; ready again once
    is_ready() says so."""
    before = _calls(repo, model)
    assert _readiness(server, model) == (True, True, True)
    assert _calls(repo, model) - before == 2 * 2 + 2  # two ModelReady + one ServerReady
    with _flag(repo, model, "not_ready"):
        assert _readiness(server, model) == (False, False, False)
        g = grpcclient.InferenceServerClient(server.url)
        try:
            assert g.infer(model, [_ms(0)]).as_numpy("OUT").tolist() == [0]
        finally:
            g.close()
    assert _readiness(server, model) == (True, True, True)


@MP_ONLY
@pytest.mark.parametrize("flag", ["raise", "number"])
def test_is_ready_raising_or_returning_no_bool_is_not_ready(
    which: str, flag: str, repo: Path, server: ServerProcess
) -> None:
    with _flag(repo, "ready_py", flag):
        assert _readiness(server, "ready_py") == (False, False, False)
    assert _readiness(server, "ready_py")[0]


@MP_ONLY
def test_is_ready_raising_is_logged_in_cores_words_at_verbose_1_only(
    which: str, repo: Path, server: ServerProcess, tmp_path: Path
) -> None:
    """As upstream: python_be.cc hands the exception's text to the core as the instance's
    readiness error, and server.cc ``ModelIsReady`` logs it with LOG_VERBOSE(1) ("Model 'm'
    version 1 is not ready: ..."); at the default verbosity nothing is logged."""
    line = "Model 'ready_py' version 1 is not ready: RuntimeError: the feature store is down"
    with _flag(repo, "ready_py", "raise"):
        assert not _readiness(server, "ready_py")[0]
    time.sleep(0.5)
    # NOTE: the shared server's log: its lines about this model only.
    assert line.split(":")[0] not in server.log()
    verbose_repo = write_api_models(tmp_path / "repo", {"ready_py": API_MODELS["ready_py"]})
    with server_factory(tmp_path) as start:
        verbose = start(verbose_repo, "--log-verbose=1")
        with _flag(verbose_repo, "ready_py", "raise"):
            assert not _readiness(verbose, "ready_py")[0]
            wait_for(lambda: line in verbose.log(), 10, "the not-ready line")


@MP_ONLY
def test_is_ready_is_answered_while_execute_runs_and_times_out_after_5_s(
    which: str, repo: Path, server: ServerProcess
) -> None:
    """is_ready() runs beside a long execute (upstream runs it on the stub's message
    thread); one that takes longer than five seconds is not ready for that check."""
    g = grpcclient.InferenceServerClient(server.url)
    got: queue.Queue[object] = queue.Queue()
    try:
        for _ in range(2):
            g.async_infer("ready_py", [_ms(3000)], lambda result, error: got.put(error or result))
        wait_queued(server.url, "ready_py", running=1)
        started = time.monotonic()
        assert g.is_model_ready("ready_py")
        assert time.monotonic() - started < 1.5
        with _flag(repo, "ready_py", "slow"):
            started = time.monotonic()
            assert not g.is_model_ready("ready_py")
            assert 4.5 < time.monotonic() - started < 6.5
        for _ in range(2):
            assert not isinstance(got.get(timeout=30), InferenceServerException)
    finally:
        g.close()


@SERVERS
def test_the_response_sender_refuses_bad_flags_and_a_missing_response_in_upstreams_words(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """response_sender.cc CheckResponseSenderArguments: flags other than 0 and
    COMPLETE_FINAL, then flags 0 without a response (before: our own words)."""
    grpc_url, _ = _urls(server, request, which)
    answers: queue.Queue[object] = queue.Queue()
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        g.start_stream(callback=lambda result, error: answers.put(error or result))
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([1], np.int32))
        g.async_stream_infer("sender_py", [n])
        got = answers.get(timeout=30)
        assert not isinstance(got, InferenceServerException), got
        unsupported = "Unable to send response. Unsupported flag provided."
        assert got.as_numpy("TEXT")[0].decode() == " | ".join(  # type: ignore[attr-defined]
            [
                unsupported,
                unsupported,
                "Inference Response object must be provided when the response flags is set "
                "to zero.",
            ]
        )
        g.stop_stream()
    finally:
        g.close()


def _output_names(module: object, url: str, asked: tuple[str, ...] | None) -> list[str]:
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    try:
        inp = module.InferInput("IN", [4], "FP32")  # type: ignore[attr-defined]
        inp.set_data_from_numpy(np.ones(4, np.float32))
        outputs = None
        if asked is not None:
            outputs = [module.InferRequestedOutput(o) for o in asked]  # type: ignore[attr-defined]
        result = client.infer("omit_py", [inp], outputs=outputs)
        names = (
            [o["name"] for o in result.get_response().get("outputs", [])]
            if module is httpclient
            else [o.name for o in result.get_response().outputs]
        )
        if "A" in names:
            np.testing.assert_array_equal(result.as_numpy("A"), np.full(4, 2, np.float32))
        return names
    finally:
        client.close()


@SERVERS
@pytest.mark.parametrize("asked", [None, ("A", "B"), ("B",)])
def test_an_output_the_model_does_not_produce_is_left_out_of_the_response(
    server: ServerProcess, request: pytest.FixtureRequest, which: str, asked: tuple[str, ...] | None
) -> None:
    """2.51 answers OK with the outputs the model gave (none when only the missing one was
    asked for); triton-mp refused such a response INTERNAL "output 'B' was not produced"."""
    grpc_url, http_url = _urls(server, request, which)
    expected = [] if asked == ("B",) else ["A"]
    assert _output_names(grpcclient, grpc_url, asked) == expected
    assert _output_names(httpclient, http_url, asked) == expected
