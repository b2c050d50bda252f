"""``backends.python.responses``: what a python model's ``execute`` returns, read as results
(process-free: no model.py, no worker)."""

from __future__ import annotations

import json

import numpy as np

from triton_mp.backends.base import BackendRequest, Outputs, response_parameters
from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.responses import (
    ResponseReader,
    parameters_refusal,
    returned_list_refusal,
)
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, TensorSpec


def _spec(outputs: tuple[TensorSpec, ...], max_batch_size: int = 8) -> ModelVersionSpec:
    return ModelVersionSpec(
        model="m",
        version=1,
        backend="python",
        model_file="/nonexistent/m/1/model.py",
        max_batch_size=max_batch_size,
        batching=BatchingSpec(kind="dynamic", max_batch_size=max_batch_size),
        inputs=(TensorSpec(name="INPUT0", datatype="FP32", dims=(4,)),),
        outputs=outputs,
        instance_ids=(0,),
        config_json=json.dumps({"name": "m", "max_batch_size": max_batch_size}),
    )


OUT = (
    TensorSpec(name="OUTPUT0", datatype="FP32", dims=(4,)),
    TensorSpec(name="OUTPUT1", datatype="FP32", dims=(4,)),
)


def _req(outputs: tuple[str, ...] = ("OUTPUT0", "OUTPUT1"), batch: int = 1) -> BackendRequest:
    return BackendRequest({"INPUT0": np.zeros((batch, 4), np.float32)}, outputs, batch)


def test_a_returned_value_must_be_a_list_of_one_entry_per_request() -> None:
    # python_backend pb_stub.cc ProcessReturnedResponses (2.51): a tuple is no list.
    assert returned_list_refusal([None, None], 2) is None
    assert returned_list_refusal((None,), 1) == (
        "Expected a list in the execute return, found type '<class 'tuple'>'."
    )
    assert returned_list_refusal({}, 1) == (
        "Expected a list in the execute return, found type '<class 'dict'>'."
    )
    assert returned_list_refusal([], 3) == (
        "Number of InferenceResponse objects do not match the number of InferenceRequest "
        "objects. InferenceRequest(s) size is:3, and InferenceResponse(s) size is:0\n"
    )


def test_response_parameters_travel_with_the_outputs() -> None:
    """Parameters become ``Outputs.parameters_json``; a JSON string whose values are of
    another type is refused with upstream's "Unsupported value type on parameters"."""
    outs = Outputs({"A": np.zeros(1)}, '{"k": 1}')
    assert isinstance(outs, dict)
    assert response_parameters(outs) == '{"k": 1}'
    assert response_parameters({"A": np.zeros(1)}) == ""
    assert parameters_refusal('{"k": 1, "b": true, "s": "x"}') is None
    assert parameters_refusal('{"k": 1.5}') == "Unsupported value type on parameters"
    assert parameters_refusal("[1]") is not None
    assert parameters_refusal("{") is not None
    for edge in (2**63 - 1, -(2**63)):
        assert parameters_refusal(json.dumps({"k": edge})) is None
    for outside in (2**63, -(2**63) - 1, 2**64):
        refusal = parameters_refusal(json.dumps({"k": outside}))
        assert refusal == "Unsupported value type on parameters"


def test_an_output_tensor_of_a_tensor_subclass_is_written() -> None:
    """``result`` takes any ``pb_utils.Tensor`` (a subclass too) and refuses anything else."""
    reader = ResponseReader(_spec(OUT), "worker m_0")

    class Mine(pb_utils.Tensor):
        __slots__ = ()

    x = np.ones((1, 4), np.float32)
    ok = reader.result(_req(), pb_utils.InferenceResponse([Mine("OUTPUT0", x)]))
    assert isinstance(ok, dict)
    assert ok["OUTPUT0"] is x
    bad = reader.result(_req(), pb_utils.InferenceResponse([x]))  # type: ignore[list-item]
    assert isinstance(bad, ErrorInfo)
    assert "put a ndarray among the output tensors" in bad.message
    assert bad.origin == "worker m_0"


def test_only_requested_outputs_are_kept_and_errors_keep_their_code() -> None:
    reader = ResponseReader(_spec(OUT), "worker m_0")
    x = np.ones((1, 4), np.float32)
    both = pb_utils.InferenceResponse(
        [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", -x)]
    )
    got = reader.result(_req(("OUTPUT1",)), both)
    assert isinstance(got, dict)
    assert list(got) == ["OUTPUT1"]
    failed = pb_utils.InferenceResponse(
        error=pb_utils.TritonError("no", pb_utils.TritonError.INVALID_ARG)
    )
    err = reader.result(_req(), failed)
    assert isinstance(err, ErrorInfo)
    assert (err.code, err.message) == (ErrorCode.INVALID_ARG, "no")
    not_a_response = reader.result(_req(), {"OUTPUT0": x})
    assert isinstance(not_a_response, ErrorInfo)
    assert "returned dict instead of an InferenceResponse" in not_a_response.message


def test_outputs_with_a_reshape_go_back_to_their_config_dims() -> None:
    """An output with ``reshape`` returns to ``[batch] + dims`` (``dims`` alone unbatched);
    one that does not fit is an INTERNAL error naming both shapes."""
    reshaped = (TensorSpec(name="OUTPUT0", datatype="FP32", dims=(2, 2), reshape=(4,)),)
    reader = ResponseReader(_spec(reshaped), "worker m_0")
    flat = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = reader.result(
        _req(("OUTPUT0",), batch=2), pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", flat)])
    )
    assert isinstance(got, dict)
    assert got["OUTPUT0"].shape == (2, 2, 2)
    unbatched = ResponseReader(_spec(reshaped, max_batch_size=0), "worker m_0")
    one = unbatched.result(
        _req(("OUTPUT0",)), pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", flat[0])])
    )
    assert isinstance(one, dict)
    assert one["OUTPUT0"].shape == (2, 2)
    bad = reader.result(
        _req(("OUTPUT0",)),
        pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(3, np.float32))]),
    )
    assert isinstance(bad, ErrorInfo)
    assert bad.code == ErrorCode.INTERNAL
    assert "has shape [3], which does not reshape to its config dims [2, 2]" in bad.message
