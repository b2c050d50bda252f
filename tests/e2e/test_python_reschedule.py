"""End to end: request rescheduling in python models (iterative sequence batching), BLS
requests to a stateful model (README "Using BLS with Stateful Models"), and the response
sender of a default-mode model (upstream since 24.07).

python_backend README "Request Rescheduling": ``request.set_release_flags(
pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` in a model with ``sequence_batching {
iterative_sequence: true }`` runs the request again in a later batch; the core's
``IterativeSequencer`` gives a request without a correlation ID a sequence of its own (an ID
and START) and clears the flags of a rescheduled request. Each case runs against triton-mp
and the real Triton 2.51 (``.peers/``; it has the feature since 23.11) on the same repository
(``tests.helpers.python_api_models.RESCHEDULE_MODELS``).
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.python_api_models import (
    DEFAULT_SENDER_MODELS,
    RESCHEDULE_MODELS,
    STATEFUL_BLS_MODELS,
)
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SERVERS = pytest.mark.parametrize("which", ["triton-mp", "triton"])


SIDE_BY_SIDE_MODELS = {
    name: PythonModel(config, source)
    for name, (config, source) in {
        **RESCHEDULE_MODELS,
        **STATEFUL_BLS_MODELS,
        **DEFAULT_SENDER_MODELS,
    }.items()
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them."""
Servers = dict[str, ServerProcess | RealTriton]


def _in(n: int, module: object = grpcclient) -> object:
    inp = module.InferInput("IN", [1], "INT32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.array([n], np.int32))
    return inp


@SERVERS
def test_a_rescheduled_request_runs_again_with_its_flags_cleared(
    which: str, shared_side_by_side: Servers
) -> None:
    """A request without a correlation ID runs IN times: the first execution sees START (the
    sequencer's), the rescheduled ones no flags; it had a correlation ID all along. Three
    at once share the one slot in turn (each keeps it until it is released for good)."""
    grpc_url, http_url = urls_of(shared_side_by_side, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    h = httpclient.InferenceServerClient(http_url)
    try:
        assert g.infer("iter_py", [_in(3)]).as_numpy("OUT").tolist() == [1, 0, 0, 1]
        assert h.infer("iter_py", [_in(2, httpclient)]).as_numpy("OUT").tolist() == [1, 0, 1]
        results: dict[int, list[int]] = {}

        def call(n: int) -> None:
            client = grpcclient.InferenceServerClient(grpc_url)
            try:
                results[n] = client.infer("iter_py", [_in(n)]).as_numpy("OUT").tolist()
            finally:
                client.close()

        threads = [threading.Thread(target=call, args=(n,)) for n in (4, 1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {4: [1, 0, 0, 0, 1], 1: [1, 1], 2: [1, 0, 1]}
    finally:
        g.close()
        h.close()


@SERVERS
def test_a_decoupled_model_reschedules_until_its_final_response(
    which: str, shared_side_by_side: Servers
) -> None:
    """The README's decoupled example: one response per execution (responses left), then
    the final one."""
    grpc_url, _ = urls_of(shared_side_by_side, which)
    answers: queue.Queue[object] = queue.Queue()
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        g.start_stream(callback=lambda result, error: answers.put(error or result))
        g.async_stream_infer("iter_dec_py", [_in(3)], request_id="r1")
        values = []
        for _ in range(3):
            got = answers.get(timeout=30)
            assert not isinstance(got, InferenceServerException), got
            values.append(int(got.as_numpy("OUT")[0]))  # type: ignore[attr-defined]
        assert values == [2, 1, 0]
        g.stop_stream()
    finally:
        g.close()


@SERVERS
def test_reschedule_without_iterative_sequence_is_refused_by_the_core(
    which: str, shared_side_by_side: Servers
) -> None:
    """Without ``iterative_sequence`` the core refuses the flag (infer_request.cc: "Request
    is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not
    configured to handle such a flag."); python_be.cc logs it and releases the request.
    Triton leaves the client without any answer (the response was dropped): its deadline
    passes. triton-mp answers the core's refusal (INVALID_ARG) instead of never answering."""
    grpc_url, _ = urls_of(shared_side_by_side, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            g.infer("resched_plain_py", [_in(2)], client_timeout=3)
        if which == "triton":
            assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        else:
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert err.value.message() == (
                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the "
                "model is not configured to handle such a flag."
            )
            assert (
                "Failed to release request: Request is released with"
                in shared_side_by_side["triton-mp"].log()
            )
        # the model serves on; its table still holds the first request's execution (flags
        # 0: no sequence batcher, correlation ID 0), so IN=1 answers both and then 0
        assert g.infer("resched_plain_py", [_in(1)]).as_numpy("OUT").tolist() == [0, 0, 0]
    finally:
        g.close()


@SERVERS
def test_bls_requests_carry_a_sequence_to_a_stateful_model(
    which: str, shared_side_by_side: Servers
) -> None:
    """``InferenceRequest(correlation_id=4, flags=START / 0 / END)`` through ``exec()``: the
    sequence batcher sees one sequence; the model sees the ID and the flags as sent."""
    grpc_url, _ = urls_of(shared_side_by_side, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        inp = grpcclient.InferInput("X", [3], "INT32")
        inp.set_data_from_numpy(np.array([1, 2, 3], np.int32))
        sums = g.infer("bls_seq_py", [inp]).as_numpy("SUMS").tolist()
        assert sums == [[1, 4, 1], [3, 4, 0], [6, 4, 2]]
    finally:
        g.close()


@SERVERS
def test_a_default_mode_model_answers_through_its_response_sender(
    which: str, shared_side_by_side: Servers
) -> None:
    """response_sender.cc / pb_stub.cc ProcessReturnedResponses for a non-decoupled model:
    one response through the sender (execute returns None); one sent and one returned fails
    the batch; the final flag before any response is refused."""
    grpc_url, _ = urls_of(shared_side_by_side, which)
    g = grpcclient.InferenceServerClient(grpc_url)

    def mode(value: int) -> list[object]:
        inp = grpcclient.InferInput("MODE", [1], "INT32")
        inp.set_data_from_numpy(np.array([value], np.int32))
        return [inp]

    try:
        assert g.infer("default_sender_py", mode(0)).as_numpy("TEXT")[0] == b"sent"
        with pytest.raises(InferenceServerException) as err:
            g.infer("default_sender_py", mode(1))
        if which == "triton":
            # NOTE: 2.51 sends both responses; upstream main's ProcessReturnedResponses
            # counts the returned one as a send and fails the batch, as triton-mp does.
            assert err.value.message() == "expected a single response, got 2"
        else:
            assert err.value.message() == (
                "Failed to process the request(s) for model 'default_sender_py_0_0', message: "
                "Unable to send response. Non-decoupled model cannot send more than one "
                "response."
            )
        assert g.infer("default_sender_py", mode(2)).as_numpy("TEXT")[0].decode() == (
            "Unable to send response. Non-decoupled model cannot send complete final before "
            "sending a response."
        )
    finally:
        g.close()
