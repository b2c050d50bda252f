"""``_native.record_with_client_id`` (``frontend/native/record_patch.h`` WithClientId): a
REQUEST record with another request id written in, as the gRPC thread sends a known call
whose id differs from the one its lesson's template was made for. For hypothesis-drawn
requests (with and without a tail: parameters, a string sequence id) and ids (empty, long,
UTF-8), the bytes equal ``encode_request``'s for the same request with that id; a record not
laid out as ``encode_request`` writes it is declined."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.protocol.messages import BlockRef, InferRequest, ReplyTo, Requester, TensorRef
from triton_mp.ipc.recordio.request_records import encode_request

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")


def native() -> Any:
    from triton_mp.frontend.native import _native

    return _native


ids = st.one_of(
    st.just(""),
    st.text(max_size=8),
    st.text(min_size=100, max_size=400),
    st.sampled_from(["é", "请求-42", "\U0001f600" * 40, "x" * 4096]),
)


def request(client_id: str, params: str, seq: int | str, outputs: int) -> InferRequest:
    """A request of two inputs and ``outputs`` outputs with id ``client_id``."""
    refs = tuple(TensorRef(f"IN{i}", "FP32", (1, 4), "/arena", 128 + 64 * i, 16) for i in range(2))
    return InferRequest(
        request_id=9,
        reply_to=ReplyTo(Requester.FRONTEND, 3),
        model="model",
        version=2,
        batch_size=1,
        inputs=refs,
        outputs=tuple(f"OUT{i}" for i in range(outputs)),
        block=BlockRef("/arena", 64, 5),
        arrival_ns=123,
        client_id=client_id,
        parameters_json=params,
        sequence_id=seq,
    )


@settings(max_examples=200, deadline=None)
@given(
    ids,
    ids,
    st.sampled_from(["{}", '{"a": 1}', '{"k": "' + "v" * 300 + '"}']),
    st.one_of(st.integers(0, 2**63), st.text(min_size=1, max_size=20)),
    st.integers(0, 3),
)
def test_another_id_is_what_encode_request_writes(
    taught: str, call: str, params: str, seq: int | str, outputs: int
) -> None:
    template = encode_request(request(taught, params, seq, outputs))
    expected = encode_request(request(call, params, seq, outputs))
    assert template is not None
    assert expected is not None
    assert native().record_with_client_id(template, call.encode()) == expected


def test_a_record_not_laid_out_so_is_declined() -> None:
    record = encode_request(request("abc", '{"a": 1}', 0, 1))
    assert record is not None
    n = native()
    assert n.record_with_client_id(record[:50], b"x") is None  # NOTE: shorter than a header
    assert n.record_with_client_id(record[:-1], b"x") is None  # NOTE: size differs
    moved = bytearray(record)
    struct.pack_into("<I", moved, 84, 104)  # NOTE: the id is no longer the last string
    assert n.record_with_client_id(bytes(moved), b"x") is None
    assert n.record_with_client_id(record, b"x" * 65536) is None  # NOTE: a u16 length
