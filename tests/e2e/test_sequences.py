"""End to end: the sequence batcher through tritonclient on a running server.

Two accumulators whose output is the running sum of their sequence: an ONNX graph built here
with implicit state (``STATE_IN`` -> ``STATE_OUT``) and START/READY/CORRID controls, Direct
strategy on two instances; and a python model keeping its sums by correlation ID, Oldest
strategy with four candidate sequences (so sixteen sequences queue in the backlog). Shown:
sixteen interleaved sequences each get exactly their own state (threads and one stream), the
idle timeout releases a sequence, and Triton's errors for bad sequence requests.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ONNX_CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" }
    }
  ]
  direct { }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

PY_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: %(idle_us)d
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 4 ]
    max_queue_delay_microseconds: 2000
  }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

PY_MODEL = """
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
            self.sums[cid] = self.sums[cid] + x
            out = pb_utils.Tensor("OUTPUT", self.sums[cid])
            responses.append(pb_utils.InferenceResponse([out]))
            if r.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[cid]
        return responses
"""


def _accumulator_onnx(path: Path) -> None:
    """``OUTPUT = INPUT + STATE_IN``, ``STATE_OUT = OUTPUT``, ``CORRID_OUT = CORRID``; every
    tensor ``[batch, 1]``; START and READY are inputs the graph does not use."""
    shape: list[int | str] = ["batch", 1]
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("STATE_IN", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("START", TensorProto.INT32, shape),
        helper.make_tensor_value_info("READY", TensorProto.INT32, shape),
        helper.make_tensor_value_info("CORRID", TensorProto.UINT64, shape),
    ]
    nodes = [
        helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("STATE_OUT", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("CORRID_OUT", TensorProto.UINT64, shape),
    ]
    graph = helper.make_graph(nodes, "acc", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    (repo / "acc_onnx" / "1").mkdir(parents=True)
    (repo / "acc_onnx" / "config.pbtxt").write_text(ONNX_CONFIG)
    _accumulator_onnx(repo / "acc_onnx" / "1" / "model.onnx")
    for name, idle_us in (("acc_py", 5_000_000), ("acc_idle_py", 300_000)):
        write_python_model(repo, name, PY_CONFIG % {"idle_us": idle_us}, PY_MODEL)
    with server_factory(Path(tmp_path_factory.mktemp("logs"))) as start:
        yield start(repo)


def _input(value: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    return [x]


def _run_sequence(
    server: ServerProcess, model: str, corrid: int | str, values: list[float]
) -> list[float]:
    client = server.client()
    try:
        sums = []
        for i, v in enumerate(values):
            res = client.infer(
                model,
                _input(v),
                sequence_id=corrid,
                sequence_start=i == 0,
                sequence_end=i == len(values) - 1,
            )
            sums.append(float(res.as_numpy("OUTPUT")[0, 0]))
            if model == "acc_onnx":
                assert int(res.as_numpy("CORRID_OUT")[0, 0]) == corrid
        return sums
    finally:
        client.close()


@pytest.mark.parametrize("model", ["acc_onnx", "acc_py"])
def test_sixteen_interleaved_sequences_each_get_their_own_state(
    server: ServerProcess, model: str
) -> None:
    values = {cid: [float(cid * 100 + k) for k in range(5)] for cid in range(1, 17)}
    with ThreadPoolExecutor(16) as pool:
        futures = {
            cid: pool.submit(_run_sequence, server, model, cid, v) for cid, v in values.items()
        }
        got = {cid: f.result(timeout=120) for cid, f in futures.items()}
    for cid, v in values.items():
        assert got[cid] == list(np.cumsum(v)), cid


def test_sixteen_sequences_interleaved_over_one_stream(server: ServerProcess) -> None:
    client = server.client()
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        # round-robin: request k of every sequence before request k+1 of any
        for k in range(4):
            for cid in range(101, 117):
                client.async_stream_infer(
                    "acc_onnx",
                    _input(float(k + 1)),
                    request_id=f"{cid}:{k}",
                    sequence_id=cid,
                    sequence_start=k == 0,
                    sequence_end=k == 3,
                )
        got: dict[str, float] = {}
        for _ in range(64):
            result, error = answers.get(timeout=60)
            assert error is None, error
            rid = result.get_response().id  # type: ignore[attr-defined]
            got[rid] = float(result.as_numpy("OUTPUT")[0, 0])  # type: ignore[attr-defined]
    finally:
        client.stop_stream()
        client.close()
    for cid in range(101, 117):
        assert [got[f"{cid}:{k}"] for k in range(4)] == [1.0, 3.0, 6.0, 10.0]


def test_a_stream_reports_a_bad_request_and_goes_on(server: ServerProcess) -> None:
    client = server.client()
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("acc_py", _input(1.0), sequence_id=555)  # no START
        client.async_stream_infer(
            "acc_py", _input(2.0), sequence_id=556, sequence_start=True, sequence_end=True
        )
        first = answers.get(timeout=60)
        second = answers.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    errors = [e for _, e in (first, second) if e is not None]
    results = [r for r, _ in (first, second) if r is not None]
    assert len(errors) == 1
    assert "must specify the START flag on the first request of the sequence" in str(errors[0])
    assert float(results[0].as_numpy("OUTPUT")[0, 0]) == 2.0  # type: ignore[attr-defined]


def test_an_idle_sequence_is_released(server: ServerProcess) -> None:
    client = server.client()
    try:
        res = client.infer("acc_idle_py", _input(5.0), sequence_id=77, sequence_start=True)
        assert float(res.as_numpy("OUTPUT")[0, 0]) == 5.0
        res = client.infer("acc_idle_py", _input(1.0), sequence_id=77)
        assert float(res.as_numpy("OUTPUT")[0, 0]) == 6.0
        time.sleep(0.8)  # past max_sequence_idle_microseconds (300 ms)
        with pytest.raises(InferenceServerException) as e:
            client.infer("acc_idle_py", _input(1.0), sequence_id=77)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert e.value.message() == (
            "inference request for sequence 77 to model "
            "'acc_idle_py' must specify the START flag on the first request of the sequence"
        )
        # a new START begins again from zero
        res = client.infer(
            "acc_idle_py", _input(2.0), sequence_id=77, sequence_start=True, sequence_end=True
        )
        assert float(res.as_numpy("OUTPUT")[0, 0]) == 2.0
    finally:
        client.close()


def _error(server: ServerProcess, model: str, **kw: object) -> InferenceServerException:
    client = server.client()
    try:
        inputs = kw.pop("inputs", None) or _input(1.0)
        with pytest.raises(InferenceServerException) as e:
            client.infer(model, inputs, **kw)  # type: ignore[arg-type]
        return e.value
    finally:
        client.close()


def test_bad_sequence_requests_get_tritons_errors(server: ServerProcess) -> None:
    e = _error(server, "acc_py", sequence_id=4242, request_id="r1")
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == (
        "inference request for sequence 4242 to model 'acc_py' must specify "
        "the START flag on the first request of the sequence"
    )
    e = _error(server, "acc_py", sequence_start=True)  # no correlation ID
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify a non-zero or non-empty correlation ID" in e.message()
    two = grpcclient.InferInput("INPUT", [2, 1], "FP32")
    two.set_data_from_numpy(np.ones((2, 1), np.float32))
    e = _error(server, "acc_py", inputs=[two], sequence_id=9, sequence_start=True)
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify batch-size 1 due to requirements of sequence batcher" in e.message()
    e = _error(server, "acc_onnx", sequence_id="abc", sequence_start=True, request_id="r2")
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == (
        "[request id: r2] sequence batching control 'CORRID' data-type is 'BYTES', but model "
        "'acc_onnx' expects 'UINT64'"
    )
    # core TRITONSERVER_InferenceRequestSetCorrelationIdString: UNSUPPORTED, no request id
    e = _error(server, "acc_py", sequence_id="x" * 129, sequence_start=True, request_id="r3")
    assert e.status() == "StatusCode.UNIMPLEMENTED"
    assert e.message() == "string correlation ID cannot be longer than 128 characters"
    # a string ID of 128 characters is fine on a model without a CORRID control
    assert _run_sequence(server, "acc_py", "y" * 128, [3.0, 4.0]) == [3.0, 7.0]


def test_malformed_sequence_parameters_are_refused(server: ServerProcess) -> None:
    channel = grpc.insecure_channel(server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        for key, field, value, expected in (
            ("sequence_id", "uint64_param", 5, "expected int64_param or string_param"),
            ("sequence_start", "int64_param", 1, "expected bool_param"),
            ("sequence_end", "string_param", "yes", "expected bool_param"),
        ):
            req = service_pb2.ModelInferRequest(model_name="acc_py")
            inp = req.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
            del inp
            req.raw_input_contents.append(np.ones(1, np.float32).tobytes())
            setattr(req.parameters[key], field, value)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert expected in (e.value.details() or "")
    finally:
        channel.close()
