"""The python backend's rules for a batch's requests before ``execute``
(``backends.python.request_rules``): a batching model's requests without inputs are refused in
2.51's words and the others run once, in order; an ensemble step's inputs are copied, a
frontend's request keeps its views. In process, no shared memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from triton_mp.backends.base import BackendRequest, PhaseTimes, Result
from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.request_rules import (
    WithoutInputs,
    check_inputs,
    own_step_inputs,
    refuse_without_inputs,
)
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import BlockRef, ErrorInfo, InferRequest, ReplyTo, Requester


def _req(
    inputs: dict[str, np.ndarray], rid: str = "", kind: Requester | None = None
) -> BackendRequest:
    token = None
    if kind is not None:
        token = InferRequest(
            request_id=1,
            reply_to=ReplyTo(kind, 0),
            model="m",
            version=1,
            batch_size=1,
            inputs=(),
            outputs=(),
            block=BlockRef("/s", 0),
            arrival_ns=1,
        )
    return BackendRequest(inputs, (), 1, rid, token=token)


X = {"A": np.zeros((1, 2), np.float32)}


def test_requests_without_inputs_are_named_by_index() -> None:
    check_inputs([_req(X), _req(X)])
    with pytest.raises(WithoutInputs) as e:
        check_inputs([_req({}), _req(X), _req({})])
    assert e.value.indices == [0, 2]


@pytest.mark.parametrize("refused", [[0, 2], [1], [0, 1, 2]])
def test_the_others_run_once_in_order_and_the_refused_get_tritons_words(
    refused: list[int],
) -> None:
    reqs = [_req({} if i in refused else X, rid) for i, rid in enumerate(("", "r1", "r2"))]
    calls: list[list[BackendRequest]] = []

    def execute(batch: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        calls.append(list(batch))
        return [{"OUT": np.full(1, reqs.index(r))} for r in batch], PhaseTimes(3, 4)

    results, times = refuse_without_inputs(reqs, refused, execute, "worker m_0")
    ran = [r for i, r in enumerate(reqs) if i not in refused]
    assert calls == ([ran] if ran else [])
    assert times == (PhaseTimes(3, 4) if ran else PhaseTimes(0, 0))
    for i, (r, got) in enumerate(zip(reqs, results, strict=True)):
        if i in refused:
            rid = r.request_id or "<id_unknown>"
            assert got == ErrorInfo(
                ErrorCode.INVALID_ARG,
                f"[request id: {rid}] out of bounds index 0: request has 0 inputs",
                "worker m_0",
            )
        else:
            assert isinstance(got, dict)
            assert got["OUT"].tolist() == [i]


def test_an_ensemble_steps_inputs_are_copies_and_a_frontends_stay_views() -> None:
    kinds = [Requester.FRONTEND, Requester.ENSEMBLE, Requester.BLS, None]
    reqs = [_req({"A": np.zeros((1, 2), np.float32)}, kind=k) for k in kinds]
    built = [
        pb_utils.InferenceRequest(
            model_name="m",
            requested_output_names=[],
            inputs=[pb_utils.Tensor(n, a) for n, a in r.inputs.items()],
        )
        for r in reqs
    ]
    assert own_step_inputs(reqs, built) is built
    for r, pb_request, kind in zip(reqs, built, kinds, strict=True):
        (t,) = pb_request.inputs()
        shared = np.shares_memory(t.as_numpy(), r.inputs["A"])
        assert shared == (kind is not Requester.ENSEMBLE), kind
        np.testing.assert_array_equal(t.as_numpy(), r.inputs["A"])
