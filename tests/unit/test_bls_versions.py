"""A BLS call's model and version, checked as the frontend checks them (core
``ModelLifeCycle::GetModel``): NOT_FOUND for an unknown model or version, or for a model
without any served version; UNAVAILABLE for a version it has but does not serve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from triton_mp.backends.python import pb_utils
from triton_mp.ipc.protocol.specs import BlsModel
from triton_mp.workers.bls.bls_client import BlsClient

MODELS = {
    "m": BlsModel(versions=(2,), max_batch_size=0, outputs=("OUT",), unavailable=(1,)),
    "gone": BlsModel(versions=(), max_batch_size=0, outputs=(), unavailable=(1,)),
}


@pytest.mark.parametrize(
    ("model", "version", "code", "message"),
    [
        ("nope", -1, pb_utils.TritonError.NOT_FOUND, "'nope' is not found"),
        ("m", 3, pb_utils.TritonError.NOT_FOUND, "'m' version 3 is not found"),
        ("m", 1, pb_utils.TritonError.UNAVAILABLE, "'m' version 1 is not at ready state"),
        ("gone", -1, pb_utils.TritonError.NOT_FOUND, "'gone' has no available versions"),
        ("gone", 1, pb_utils.TritonError.UNAVAILABLE, "'gone' version 1 is not at ready state"),
    ],
)
def test_bls_versions_answer_as_the_frontend(
    model: str, version: int, code: int, message: str
) -> None:
    request = pb_utils.InferenceRequest(
        model_name=model, model_version=version, inputs=[], requested_output_names=[]
    )
    client = SimpleNamespace(_own="caller")
    error = BlsClient._check(client, request, False, MODELS)  # type: ignore[arg-type]
    assert error == (code, f"Request for unknown model: {message}")


def test_a_served_version_passes() -> None:
    request = pb_utils.InferenceRequest(
        model_name="m", model_version=2, inputs=[], requested_output_names=[]
    )
    assert BlsClient._check(SimpleNamespace(_own="x"), request, False, MODELS) is None  # type: ignore[arg-type]
