"""Request tracing end to end: ``--trace-config`` on a running server, every trace in the file.

Drives add_sub_py over gRPC, HTTP and a gRPC stream, and the decoupled repeat_int32 over a
stream, with ``rate=1``; then checks every trace of Triton's JSON file: its header, the
timestamp names of its transport, their causal order, that each came from the process that
owns the event (the scheduler's and the worker's stamps fall between the frontend's), and
that all of them lie within the latency the client measured around its call (a send's end,
which the server sees after its write completed, may come after the client read the answer).
"""

from __future__ import annotations

import json
import queue
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.server import PROJECT_REPOSITORY, REPO_ROOT, ServerProcess, wait_for

pytestmark = pytest.mark.timeout(240)

CORE = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
GRPC = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *CORE, "GRPC_SEND_START", "GRPC_SEND_END"]
HTTP = ["HTTP_RECV_START", "HTTP_RECV_END", *CORE, "HTTP_SEND_START", "HTTP_SEND_END"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trace_repo")
    for name in ("add_sub_py", "repeat_int32"):
        shutil.copytree(PROJECT_REPOSITORY / name, root / name)
    return root


def _inputs(module, n: int = 16):  # type: ignore[no-untyped-def]
    a = np.arange(n, dtype=np.float32).reshape(1, n)
    ins = [module.InferInput("INPUT0", [1, n], "FP32"), module.InferInput("INPUT1", [1, n], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    return ins


def load_traces(path: Path) -> dict[int, dict]:
    """The trace file -> per id: its header and its (name, ns) stamps in file order."""
    out: dict[int, dict] = {}
    for obj in json.loads(path.read_text()):
        t = out.setdefault(obj["id"], {"stamps": [], "tensors": []})
        if "model_name" in obj:
            t["header"] = obj
        elif "timestamps" in obj:
            t["stamps"] += [(s["name"], s["ns"]) for s in obj["timestamps"]]
        else:
            t["tensors"].append(obj)
    return out


def _check_order(stamps: list[tuple[str, int]], expected: list[str]) -> dict[str, int]:
    names = [n for n, _ in stamps if n != "INFER_RESPONSE_COMPLETE"]
    assert sorted(names) == sorted(expected), names
    at = dict(stamps)
    ns = [at[n] for n in expected]
    assert ns == sorted(ns), list(zip(expected, ns, strict=True))
    return at


def test_every_trace_names_orders_and_times_its_events(repo: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = ServerProcess(
        repo,
        tmp_path / "server.log",
        "--trace-config",
        f"triton,file={trace_file}",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=1",
    )
    windows: dict[str, tuple[int, int]] = {}
    try:
        server.wait_live()
        g = grpcclient.InferenceServerClient(server.url)
        h = httpclient.InferenceServerClient(server.http_url)
        for i in range(3):
            t0 = time.monotonic_ns()
            g.infer("add_sub_py", _inputs(grpcclient), request_id=f"grpc{i}")
            windows[f"grpc{i}"] = (t0, time.monotonic_ns())
            t0 = time.monotonic_ns()
            h.infer("add_sub_py", _inputs(httpclient), request_id=f"http{i}")
            windows[f"http{i}"] = (t0, time.monotonic_ns())
        results: queue.Queue = queue.Queue()
        g.start_stream(callback=lambda result, error: results.put((result, error)))
        t0 = time.monotonic_ns()
        g.async_stream_infer("add_sub_py", _inputs(grpcclient), request_id="stream0")
        r, e = results.get(timeout=30)
        assert e is None
        windows["stream0"] = (t0, time.monotonic_ns())
        ins = [
            grpcclient.InferInput("IN", [3], "INT32"),
            grpcclient.InferInput("DELAY", [3], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        ins[0].set_data_from_numpy(np.array([4, 5, 6], np.int32))
        ins[1].set_data_from_numpy(np.array([1, 1, 1], np.uint32))
        ins[2].set_data_from_numpy(np.array([0], np.uint32))
        t0 = time.monotonic_ns()
        # NOTE: the window closes at the final flag, not at the third response: the request
        # ends (REQUEST_END) when its final flag is in, which may follow the last response
        g.async_stream_infer(
            "repeat_int32", ins, request_id="decoupled0", enable_empty_final_response=True
        )
        responses = 0
        while True:
            r, e = results.get(timeout=30)
            assert e is None
            final = r.get_response().parameters["triton_final_response"].bool_param
            responses += not final or bool(r.get_response().outputs)
            if final:
                break
        assert responses == 3
        windows["decoupled0"] = (t0, time.monotonic_ns())
        g.stop_stream()
        g.close()
        h.close()
    finally:
        assert server.stop() == 0
    traces = load_traces(trace_file)
    by_request = {t["header"].get("request_id"): t for t in traces.values()}
    assert set(by_request) == set(windows), sorted(by_request, key=str)
    for rid, t in by_request.items():
        header = t["header"]
        lo, hi = windows[rid]
        # NOTE: *_SEND_END is the server seeing its write complete, which may come after the
        # client has read the response: it is bounded below only (by its SEND_START).
        outside = [
            (n, ns - lo)
            for n, ns in t["stamps"]
            if not lo <= ns <= hi and not (n.endswith("_SEND_END") and ns > hi)
        ]
        assert not outside, (rid, outside, hi - lo)
        if rid == "decoupled0":
            assert header["model_name"] == "repeat_int32"
            names = [n for n, _ in t["stamps"]]
            assert names.count("INFER_RESPONSE_COMPLETE") == 3
            # three responses and the empty final one the client asked for
            assert names.count("GRPC_SEND_START") == names.count("GRPC_SEND_END") == 4
            at = dict(t["stamps"])
            order = ["GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START"]
            assert [at[n] for n in order] == sorted(at[n] for n in order)
            # the request ended (its final answer in) after every response arrived
            arrived = [ns for n, ns in t["stamps"] if not n.startswith("GRPC_SEND")]
            assert at["REQUEST_END"] == max(arrived)
            continue
        assert header["model_name"] == "add_sub_py"
        assert header["model_version"] == 1
        assert "parent_id" not in header
        at = _check_order(t["stamps"], HTTP if rid.startswith("http") else GRPC)
        # NOTE: the response arrived in the frontend after the worker wrote it, before the
        # frontend ended the request.
        assert at["COMPUTE_OUTPUT_START"] <= at["INFER_RESPONSE_COMPLETE"] <= at["REQUEST_END"]
    # one clock: the ids are those of one frontend, counted from 1
    assert sorted(traces) == list(range(1, len(traces) + 1))


BLS_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
"""
BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            traced = pb_utils.InferenceRequest(
                model_name="add_sub_py", requested_output_names=["OUTPUT0"], inputs=inputs,
                trace=request.trace(),
            ).exec()
            # an untraced call: no trace argument
            pb_utils.InferenceRequest(
                model_name="add_sub_py", requested_output_names=["OUTPUT1"], inputs=inputs
            ).exec()
            out = pb_utils.get_output_tensor_by_name(traced, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
"""


def test_bls_children_and_tensors(repo: Path, tmp_path: Path) -> None:
    """A BLS call made with ``trace=request.trace()`` is a child trace (``parent_id``) with
    its own events inside its parent's compute; the one made without is not traced. The
    TENSORS level adds the inputs as queued and as the backend saw them, and its outputs."""
    from tests.helpers.repos import write_python_model

    bls_repo = tmp_path / "repo"
    shutil.copytree(repo, bls_repo)
    write_python_model(bls_repo, "bls_trace_py", BLS_CONFIG, BLS_MODEL)
    trace_file = tmp_path / "trace.json"
    server = ServerProcess(
        bls_repo,
        tmp_path / "server.log",
        "--trace-config",
        f"triton,file={trace_file}",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "level=TENSORS",
        "--trace-config",
        "rate=1",
    )
    try:
        server.wait_live()
        g = grpcclient.InferenceServerClient(server.url)
        ins = _inputs(grpcclient)
        ins[0].set_data_from_numpy(np.full((1, 16), 2, np.float32))
        ins[1].set_data_from_numpy(np.full((1, 16), 3, np.float32))
        g.infer("bls_trace_py", ins, request_id="parent")
        g.close()
    finally:
        assert server.stop() == 0
    traces = load_traces(trace_file)
    assert len(traces) == 2
    parent = next(t for t in traces.values() if t["header"]["model_name"] == "bls_trace_py")
    child = next(t for t in traces.values() if t["header"]["model_name"] == "add_sub_py")
    assert child["header"]["parent_id"] == parent["header"]["id"]
    p, c = dict(parent["stamps"]), _check_order(child["stamps"], CORE)
    assert p["COMPUTE_START"] < c["REQUEST_START"] < c["REQUEST_END"] < p["COMPUTE_OUTPUT_START"]
    activities = [(o["activity"], o["tensor"]["name"]) for o in parent["tensors"]]
    assert activities == [
        ("TENSOR_QUEUE_INPUT", "INPUT0"),
        ("TENSOR_QUEUE_INPUT", "INPUT1"),
        ("TENSOR_BACKEND_INPUT", "INPUT0"),
        ("TENSOR_BACKEND_INPUT", "INPUT1"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"),
    ]
    out = parent["tensors"][-1]["tensor"]
    assert out == {
        "name": "OUTPUT0",
        "data": ",".join(["5.0"] * 16),
        "shape": "1,16",
        "dtype": "FP32",
    }
    assert parent["tensors"][0]["tensor"]["data"] == ",".join(["2.0"] * 16)
    assert [o["activity"] for o in child["tensors"]] == [
        "TENSOR_BACKEND_INPUT",
        "TENSOR_BACKEND_INPUT",
        "TENSOR_BACKEND_OUTPUT",
    ]


def test_ensemble_steps_are_child_traces(tmp_path: Path) -> None:
    """pipe3 (scale_py -> add_py -> scale_py): the ensemble's trace has the frontend's and
    the scheduler's events, each step a child trace with parent_id, its own REQUEST_START /
    END from the scheduler and its worker's COMPUTE_*, one after the other, inside the
    ensemble's request and the client's call."""
    repo = tmp_path / "repo"
    models = REPO_ROOT / "tests" / "ensemble_models"
    for name in ("pipe3", "scale_py", "add_py"):
        shutil.copytree(models / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    trace_file = tmp_path / "trace.json"
    server = ServerProcess(
        repo,
        tmp_path / "server.log",
        "--trace-config",
        f"triton,file={trace_file}",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=1",
    )
    try:
        server.wait_live()
        g = grpcclient.InferenceServerClient(server.url)
        wait_for(lambda: g.is_model_ready("pipe3"), 120, "pipe3 ready")
        ins = [grpcclient.InferInput(n, [2, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        for t in ins:
            t.set_data_from_numpy(np.ones((2, 4), np.float32))
        t0 = time.monotonic_ns()
        g.infer("pipe3", ins, request_id="ens")
        t1 = time.monotonic_ns()
        g.close()
    finally:
        assert server.stop() == 0
    traces = load_traces(trace_file)
    parent = next(t for t in traces.values() if t["header"]["model_name"] == "pipe3")
    children = [t for t in traces.values() if t["header"].get("parent_id")]
    assert len(traces) == 4
    assert {c["header"]["parent_id"] for c in children} == {parent["header"]["id"]}
    assert all(c["header"]["request_id"] == "ens" for c in children)
    at = _check_order(
        parent["stamps"],
        ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START"]
        + ["REQUEST_END", "GRPC_SEND_START", "GRPC_SEND_END"],
    )
    steps = sorted(children, key=lambda c: dict(c["stamps"])["REQUEST_START"])
    assert [c["header"]["model_name"] for c in steps] == ["scale_py", "add_py", "scale_py"]
    previous_end = at["QUEUE_START"]
    for step in steps:
        c = _check_order(step["stamps"], CORE)
        assert previous_end <= c["REQUEST_START"]
        assert c["REQUEST_END"] <= at["REQUEST_END"]
        previous_end = c["REQUEST_END"]
    assert t0 <= at["GRPC_WAITREAD_START"]
    assert at["REQUEST_END"] <= t1
