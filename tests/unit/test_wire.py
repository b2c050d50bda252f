"""frontend/grpc/wire.py: tensor bytes split out of, and put into, ModelInfer messages by hand."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.grpc.wire import (
    MALFORMED,
    infer_response_bytes,
    split_infer_request,
    tolerant,
)


def _request(raws: list[bytes]) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="r-1")
    req.parameters["priority"].int64_param = 3
    for i, _ in enumerate(raws):
        t = req.inputs.add(name=f"IN{i}", datatype="UINT8", shape=[1, 4])
        t.parameters["x"].string_param = "y"
    req.outputs.add(name="OUT")
    req.raw_input_contents.extend(raws)
    return req


@given(st.lists(st.binary(max_size=300), max_size=4))
def test_split_equals_protobuf(raws: list[bytes]) -> None:
    req = _request(raws)
    wire = split_infer_request(req.SerializeToString())
    assert [bytes(v) for v in wire.raw] == raws
    expected = pb.ModelInferRequest()
    expected.CopyFrom(req)
    del expected.raw_input_contents[:]
    assert wire.request == expected


def test_raw_fields_anywhere_in_the_message() -> None:
    # NOTE: a peer may write fields in any order; entries of field 7 keep their order.
    head = pb.ModelInferRequest(model_name="m").SerializeToString()
    tail = pb.ModelInferRequest(id="late").SerializeToString()
    raw1 = pb.ModelInferRequest(raw_input_contents=[b"\x01\x02"]).SerializeToString()
    raw2 = pb.ModelInferRequest(raw_input_contents=[b"", b"zz"]).SerializeToString()
    data = raw1 + head + raw2 + tail
    wire = split_infer_request(data)
    assert [bytes(v) for v in wire.raw] == [b"\x01\x02", b"", b"zz"]
    assert wire.request.model_name == "m"
    assert wire.request.id == "late"
    assert len(wire.request.raw_input_contents) == 0


def test_no_copy_of_tensor_bytes() -> None:
    data = _request([b"a" * 1000]).SerializeToString()
    wire = split_infer_request(data)
    assert wire.raw[0].obj is data


@pytest.mark.parametrize(
    "data",
    [
        b"\x3a\x05ab",  # field 7 claims 5 bytes, 2 follow
        b"\x0a",  # field 1 with no length
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a varint over 10 bytes
    ],
)
def test_malformed_messages_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        split_infer_request(data)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=300)), max_size=4))
def test_response_equals_protobuf(raws: list[bytes | None]) -> None:
    resp = pb.ModelInferResponse(model_name="m", model_version="1", id="r")
    for i, _ in enumerate(raws):
        resp.outputs.add(name=f"O{i}", datatype="BYTES", shape=[2])
    data = infer_response_bytes(resp, [None if r is None else memoryview(r) for r in raws])
    expected = pb.ModelInferResponse()
    expected.CopyFrom(resp)
    expected.raw_output_contents.extend([r or b"" for r in raws])
    assert pb.ModelInferResponse.FromString(data) == expected


def test_status_messages_are_cut_to_fit_a_grpc_trailer() -> None:
    from triton_mp.frontend.grpc.servicer import MAX_STATUS_MESSAGE_BYTES, status_message

    assert status_message("short") == "short"
    exact = "x" * MAX_STATUS_MESSAGE_BYTES
    assert status_message(exact) == exact
    cut = status_message("é" * 5000)  # 10,000 bytes; never split inside a character
    assert len(cut.encode()) <= MAX_STATUS_MESSAGE_BYTES
    head, _, rest = cut.partition("... [")
    count, _, tail = rest.partition(" bytes cut] ...")
    assert set(head) == set(tail) == {"é"}
    assert len(head.encode()) + int(count) + len(tail.encode()) == 10000
    # the end of a message is kept: Triton says why last, after a request id of any size
    why = status_message("[request id: " + "y" * 1_000_000 + "] the reason")
    assert why.startswith("[request id: yyy")
    assert why.endswith("y] the reason")


def test_a_tolerant_deserializer_marks_bytes_that_do_not_parse() -> None:
    parse = tolerant(pb.ServerLiveRequest.FromString)
    assert parse(b"") == pb.ServerLiveRequest()
    assert parse(b"\xff\xff\xff") is MALFORMED
    assert tolerant(split_infer_request)(b"\x0a\x05ab") is MALFORMED
    assert tolerant(None)(b"\xff") == b"\xff"
