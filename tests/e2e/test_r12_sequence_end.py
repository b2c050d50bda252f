"""A request without START sent after its sequence's END, while the END still waits behind a
running request, side by side with the real Triton 2.51.

Triton's sequence batcher forgets a correlation ID when it queues the END request (core
``SequenceBatchScheduler::Enqueue``), so the next request of that ID without START is
refused at once: "must specify the START flag on the first request of the sequence". A model
that takes a second per request keeps the END queued while the later request arrives, over a
gRPC stream (in order) and as unary async calls.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
}
"""
MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.total = 0

    def execute(self, requests):
        time.sleep(1.0)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if pb_utils.get_input_tensor_by_name(r, "START").as_numpy().item():
                self.total = 0
            self.total += int(x.item())
            total = np.full(x.shape, self.total, np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return out
"""
SIDE_BY_SIDE_MODELS = {"slow_sum": PythonModel(CONFIG, MODEL)}
"""slow_sum: one request a second; OUTPUT0 is the running sum of the sequence's INPUT0s
(tests/e2e/conftest.py's ``shared_side_by_side`` serves it)."""

REFUSAL = (
    "inference request for sequence {} to model 'slow_sum' must specify the START flag on "
    "the first request of the sequence"
)


def _value(v: int) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.full((1, 1), v, np.int32))
    return [t]


Answers = queue.Queue[tuple[str, object]]
"""(tag, OUTPUT0 or "<status>: <message>") per answer."""


def _record(answers: Answers, tag: str | None = None) -> Callable[..., None]:
    """A tritonclient callback that puts ``(tag, answer)``; without ``tag`` (a stream) the
    tag is the response's id, or "error" for an error (a stream's errors carry no id)."""

    def done(result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
        if error is not None:
            answers.put((tag or "error", f"{error.status()}: {error.message()}"))
        else:
            assert result is not None
            name = tag or result.get_response().id
            answers.put((name, int(result.as_numpy("OUTPUT0").item())))

    return done


def _collect(answers: Answers, n: int) -> dict[str, object]:
    got = {}
    for _ in range(n):
        tag, answer = answers.get(timeout=30)
        got[tag] = answer
    return got


def test_a_request_after_a_queued_end_is_refused_on_a_stream(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    for server, proc in shared_side_by_side.items():
        answers: queue.Queue[tuple[str, object]] = queue.Queue()
        with grpcclient.InferenceServerClient(proc.url) as client:
            client.start_stream(callback=_record(answers))
            send = client.async_stream_infer
            send("slow_sum", _value(1), request_id="start", sequence_id=41, sequence_start=True)
            send("slow_sum", _value(2), request_id="end", sequence_id=41, sequence_end=True)
            send("slow_sum", _value(4), request_id="after", sequence_id=41)
            got = _collect(answers, 3)
            client.stop_stream()
        # NOTE: tritonclient gives a stream's error no status
        refused = f"None: {REFUSAL.format(41)}"
        assert got == {"start": 1, "end": 3, "error": refused}, server


def test_a_unary_request_after_a_queued_end_is_refused(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    for server, proc in shared_side_by_side.items():
        answers: queue.Queue[tuple[str, object]] = queue.Queue()
        with grpcclient.InferenceServerClient(proc.url) as client:
            client.async_infer(
                "slow_sum",
                _value(1),
                _record(answers, "start"),
                sequence_id=42,
                sequence_start=True,
            )
            time.sleep(0.2)  # NOTE: the START runs for a second from about now
            client.async_infer(
                "slow_sum", _value(2), _record(answers, "end"), sequence_id=42, sequence_end=True
            )
            time.sleep(0.2)
            client.async_infer("slow_sum", _value(4), _record(answers, "after"), sequence_id=42)
            got = _collect(answers, 3)
        assert got == {
            "start": 1,
            "end": 3,
            "after": f"StatusCode.INVALID_ARGUMENT: {REFUSAL.format(42)}",
        }, server
