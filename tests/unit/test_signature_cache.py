"""The signature cache of request validation (``frontend.validation.signature``).

A signature that passed skips only the checks it decides; every data check still runs with
the same message, a request that failed is never remembered, and a reloaded model (a new
``Model`` object) misses. No server, no processes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.fake_frontend import model_entry, table
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.model_table import ModelTable
from triton_mp.frontend.request import (
    InferenceRequest,
    InputTensor,
    RequestedOutput,
    bool_parameter,
)
from triton_mp.frontend.validation.request import validate_request
from triton_mp.frontend.validation.signature import SignatureCache

FP32_2 = np.array([1, 2], np.float32).tobytes()
INT32_3 = np.array([1, 2, 3], np.int32).tobytes()


def _models() -> ModelTable:
    return table(
        model_entry(
            "plain",
            inputs=(("A", mc.TYPE_FP32, (2,)), ("B", mc.TYPE_INT32, (-1,))),
            outputs=("X", "Y"),
        ),
        model_entry("batched", max_batch_size=4, inputs=(("A", mc.TYPE_FP32, (2,)),)),
    )


def _req(**kw: object) -> InferenceRequest:
    fields: dict[str, object] = {
        "model_name": "plain",
        "id": "r",
        "inputs": (InputTensor("A", "FP32", (2,)), InputTensor("B", "INT32", (3,))),
        "raw_inputs": (FP32_2, INT32_3),
    }
    fields.update(kw)
    return InferenceRequest(**fields)  # type: ignore[arg-type]


def _check(models: ModelTable, req: InferenceRequest, cache: SignatureCache | None):  # type: ignore[no-untyped-def]
    model, version = models.resolve(req.model_name, req.model_version)
    return validate_request(req, model, version, None, cache)


def _message(models: ModelTable, req: InferenceRequest, cache: SignatureCache | None) -> str:
    with pytest.raises(TritonMPError) as e:
        _check(models, req, cache)
    return f"{e.value.code}: {e.value.message}"


def test_a_hit_gives_the_same_valid_request_as_a_full_check() -> None:
    models, cache = _models(), SignatureCache()
    first = _check(models, _req(), cache)
    assert (cache.hits, cache.misses, len(cache)) == (0, 1, 1)
    second = _check(models, _req(), cache)
    assert (cache.hits, cache.misses) == (1, 1)
    assert second == first == _check(models, _req(), None)
    assert second.outputs == ("X", "Y")
    assert second.inputs[1].shape == (3,)


def test_another_shape_or_output_list_is_another_signature() -> None:
    models, cache = _models(), SignatureCache()
    _check(models, _req(), cache)
    other = _req(
        inputs=(InputTensor("A", "FP32", (2,)), InputTensor("B", "INT32", (1,))),
        raw_inputs=(FP32_2, INT32_3[:4]),
    )
    assert _check(models, other, cache).inputs[1].shape == (1,)
    only_y = _check(models, _req(outputs=(RequestedOutput("Y"),)), cache)
    assert only_y.outputs == ("Y",)
    assert (cache.hits, cache.misses, len(cache)) == (0, 3, 3)


@pytest.mark.parametrize(
    "bad",
    [
        {"raw_inputs": (FP32_2, INT32_3[:8])},  # byte size
        {"raw_inputs": (FP32_2,)},  # too few raw entries
        {"raw_inputs": (FP32_2[:4],)},  # too few entries, found before a byte size
        {"raw_inputs": ()},  # no data at all
        {
            "inputs": (
                InputTensor("A", "FP32", (2,), contents={"fp32_contents": [1.0, 2.0]}),
                InputTensor("B", "INT32", (3,)),
            )
        },  # typed contents together with raw_input_contents
    ],
)
def test_data_errors_on_a_hit_are_the_full_checks_errors(bad: dict[str, object]) -> None:
    models, cache = _models(), SignatureCache()
    _check(models, _req(), cache)
    expected = _message(models, _req(**bad), None)
    assert _message(models, _req(**bad), cache) == expected
    # NOTE: typed contents are never a hit: their frontend checks are not the signature's
    typed = any(t.contents for t in _req(**bad).inputs)
    assert cache.hits == (0 if typed else 1)


def test_a_request_that_fails_is_never_remembered() -> None:
    models, cache = _models(), SignatureCache()
    wrong_type = _req(inputs=(InputTensor("A", "FP32", (2,)), InputTensor("B", "FP32", (3,))))
    for _ in range(2):
        assert "data-type is 'FP32'" in _message(models, wrong_type, cache)
    # NOTE: a data error after the signature checks is not stored either.
    short = _req(raw_inputs=(FP32_2, INT32_3[:8]))
    assert "byte size mismatch" in _message(models, short, cache)
    over = InferenceRequest(
        model_name="batched", id="r", inputs=(InputTensor("A", "FP32", (5, 2)),),
        raw_inputs=(FP32_2 * 5,),
    )  # fmt: skip
    for _ in range(2):
        assert "batch-size must be <= 4" in _message(models, over, cache)
    assert len(cache) == 0
    assert cache.hits == 0


def test_a_reloaded_model_misses_and_is_checked_against_its_new_config() -> None:
    models, cache = _models(), SignatureCache()
    _check(models, _req(), cache)
    # NOTE: a reload that changes B's dims to [2]: the table makes a new Model object.
    new_b = (("A", mc.TYPE_FP32, (2,)), ("B", mc.TYPE_INT32, (2,)))
    models.update((model_entry("plain", inputs=new_b, outputs=("X", "Y")),))
    assert "unexpected shape for input 'B'" in _message(models, _req(), cache)
    assert cache.hits == 0
    assert len(cache) == 0


def test_tensors_with_parameters_are_not_cached() -> None:
    models, cache = _models(), SignatureCache()
    out = RequestedOutput("X", {"binary_data": bool_parameter(True)})
    _check(models, _req(outputs=(out,)), cache)
    assert len(cache) == 0
    assert SignatureCache.key(_req(outputs=(out,)), 1) is None


def test_a_full_cache_starts_over() -> None:
    models, cache = _models(), SignatureCache(capacity=2)
    for n in (1, 2, 3):
        req = _req(
            inputs=(InputTensor("A", "FP32", (2,)), InputTensor("B", "INT32", (n,))),
            raw_inputs=(FP32_2, INT32_3[: 4 * n]),
        )
        _check(models, req, cache)
    assert len(cache) == 1
