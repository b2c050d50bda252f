"""HTTP inference answers (``infer_codec.render_infer_response``) on bytes (no server).

JSON ``data`` or a binary tail per output, in order; client shared memory outputs; parameters;
compression by Accept-Encoding; output bytes that disagree with their shape are INTERNAL.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from typing import Any

import numpy as np
import pytest

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.http.infer_codec import (
    HEADER_LENGTH,
    InferPlan,
    render_infer_response,
    response_encoding,
)
from triton_mp.frontend.http.json_tensors import json_output_data
from triton_mp.ipc import TensorRef


class FakeResult:
    """The part of ticket.InferResult that rendering reads."""

    def __init__(
        self,
        outputs: list[tuple[TensorRef, bytes | None]],
        request_id: str = "",
        parameters_json: str = "",
    ) -> None:
        self.model = "m"
        self.parameters_json = parameters_json
        self.version = 3
        self.request_id = request_id
        self.outputs = tuple(ref for ref, _ in outputs)
        self._data = {ref.name: data for ref, data in outputs}

    def view(self, ref: TensorRef) -> memoryview | None:
        data = self._data[ref.name]
        return None if data is None else memoryview(data)


def _ref(name: str, datatype: str, shape: tuple[int, ...], nbytes: int, region: int = 0) -> Any:
    return TensorRef(name, datatype, shape, "seg", 0, nbytes, region)


def test_outputs_render_as_json_data_or_a_binary_tail_in_order() -> None:
    f32 = np.array([[1.5, 2]], np.float32)
    i64 = np.array([7, -8], np.int64)
    strings = b"".join(struct.pack("<I", len(s)) + s for s in (b"a", b"bc"))
    flags = np.array([True, False], np.bool_)
    result = FakeResult(
        [
            (_ref("F", "FP32", (1, 2), 8), f32.tobytes()),
            (_ref("I", "INT64", (2,), 16), i64.tobytes()),
            (_ref("S", "BYTES", (2,), len(strings)), strings),
            (_ref("B", "BOOL", (2,), 2), flags.tobytes()),
            (_ref("Z", "FP32", (0,), 0), b""),
        ],
        request_id="q",
    )
    plan = InferPlan(binary_default=False, binary={"I": True, "S": True, "Z": True})
    body, headers = render_infer_response(result, plan, None)  # type: ignore[arg-type]
    n = int(headers[HEADER_LENGTH])
    assert headers["Content-Type"] == "application/octet-stream"
    doc = json.loads(body[:n])
    assert doc["id"] == "q"
    assert doc["model_name"] == "m"
    assert doc["model_version"] == "3"
    out = {o["name"]: o for o in doc["outputs"]}
    assert [o["name"] for o in doc["outputs"]] == ["F", "I", "S", "B", "Z"]
    assert out["F"] == {"name": "F", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]}
    assert out["B"]["data"] == [True, False]
    assert out["I"]["parameters"] == {"binary_data_size": 16}
    assert "data" not in out["I"]
    assert out["Z"]["parameters"] == {"binary_data_size": 0}
    assert body[n:] == i64.tobytes() + strings


def test_an_all_json_answer_has_no_header_length_and_no_empty_id() -> None:
    result = FakeResult([(_ref("F", "FP32", (1,), 4), np.float32(0.1).tobytes())])
    body, headers = render_infer_response(result, InferPlan(), None)  # type: ignore[arg-type]
    assert headers == {"Content-Type": "application/json"}
    doc = json.loads(body)
    assert "id" not in doc
    # NOTE: the float32 value widened to double, as Triton's JSON writer prints it.
    assert doc["outputs"][0]["data"] == [float(np.float32(0.1))]


def test_outputs_in_client_shared_memory_carry_neither_data_nor_size() -> None:
    result = FakeResult([(_ref("F", "FP32", (1,), 4, region=9), None)])
    body, _ = render_infer_response(result, InferPlan(binary_default=True), None)  # type: ignore[arg-type]
    assert json.loads(body)["outputs"] == [{"name": "F", "datatype": "FP32", "shape": [1]}]


def test_bytes_outputs_render_as_json_strings() -> None:
    data = b"".join(struct.pack("<I", len(s)) + s for s in (b"x", "é".encode()))
    assert json_output_data("S", "BYTES", (2,), memoryview(data)) == ["x", "é"]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_outputs_cannot_be_json(datatype: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        json_output_data("H", datatype, (1,), memoryview(b"\0\0"))
    assert e.value.message == (
        f"sending {datatype} data via JSON is not supported. Please use the binary data format "
        "for output"
    )


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("FP32", b"\0" * 6), ("BYTES", struct.pack("<I", 9) + b"ab"), ("BYTES", b"\0\0")],
)
def test_output_bytes_that_do_not_match_the_shape_are_internal(datatype: str, data: bytes) -> None:
    with pytest.raises(TritonMPError) as e:
        json_output_data("O", datatype, (2,), memoryview(data))
    assert e.value.code == ErrorCode.INTERNAL
    assert e.value.message == "output tensor shape does not match size of output for 'O'"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("br", "identity"),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("identity;q=1, gzip;q=0.9", "identity"),
        ("gzip;q=x, deflate", "deflate"),
        ("", "identity"),
    ],
)
def test_accept_encoding_picks_the_heaviest_supported_coding(accept: str, expected: str) -> None:
    assert response_encoding(accept) == expected


@pytest.mark.parametrize(
    ("coding", "inflate"),
    [("gzip", gzip.decompress), ("deflate", zlib.decompress)],
)
def test_answers_are_compressed_when_asked(coding: str, inflate: Any) -> None:
    result = FakeResult([(_ref("F", "FP32", (2,), 8), np.ones(2, np.float32).tobytes())])
    body, headers = render_infer_response(result, InferPlan(binary_default=True), coding)  # type: ignore[arg-type]
    assert headers["Content-Encoding"] == coding
    plain = inflate(body)
    n = int(headers[HEADER_LENGTH])
    assert plain[n:] == np.ones(2, np.float32).tobytes()


def test_response_parameters_render_between_model_version_and_outputs() -> None:
    """http_server.cc FinalizeResponse: id, model_name, model_version, parameters, outputs."""
    result = FakeResult([(_ref("F", "FP32", (1,), 4), b"\0\0\0\0")], "", '{"k": 1, "b": true}')
    body, headers = render_infer_response(result, InferPlan(), None)  # type: ignore[arg-type]
    doc = json.loads(body[: int(headers.get(HEADER_LENGTH, len(body)))])
    assert list(doc) == ["model_name", "model_version", "parameters", "outputs"]
    assert doc["parameters"] == {"k": 1, "b": True}
    plain, _ = render_infer_response(FakeResult([]), InferPlan(), None)  # type: ignore[arg-type]
    assert "parameters" not in json.loads(plain)
