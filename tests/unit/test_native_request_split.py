"""The native server's split of a ModelInferRequest (``native/request_split.cc``) against
its twin and rule, ``frontend/grpc/wire.py``'s ``_scan``: on arbitrary bytes, on valid
messages, on valid messages cut or with bytes flipped, and on hand-built field sequences
with long, over-long and over-64-bit varints, the native split declines exactly where
``_scan`` raises, and otherwise finds the same raw entries, head, key and id; and
``split_native`` then gives what ``split_infer_request`` gives."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.grpc.wire import (
    WireInferRequest,
    _scan,
    split_infer_request,
    split_native,
)
from triton_mp.frontend.grpc.wire import _encode_varint as varint
from triton_mp.frontend.native import _NATIVE

pytestmark = pytest.mark.skipif(_NATIVE is None, reason="native extension not built")


def expected(data: bytes) -> tuple[bytes, bytes, bytes | None, list[bytes]] | None:
    """``_scan``'s answer in the native split's terms; None where it raises."""
    try:
        raw, rest, ids, id_view = _scan(data, memoryview(data))
    except (ValueError, IndexError):
        return None
    head = b"".join(rest)
    key = b"".join(v for i, v in enumerate(rest) if i not in ids)
    return head, key, None if id_view is None else bytes(id_view), [bytes(v) for v in raw]


def check(data: bytes) -> None:
    split = _NATIVE.split_infer(data)  # type: ignore[union-attr]
    want = expected(data)
    if want is None:
        assert split is None
    else:
        assert split is not None
        head, key, id_value, spans = split
        assert (head, key, id_value) == want[:3]
        assert [data[at : at + n] for at, n in spans] == want[3]
    same_request(data, split)


def same_request(data: bytes, split: object) -> None:
    """``split_native`` on the split answers as ``split_infer_request`` on the bytes."""
    outcomes = []
    for parse in (lambda k: split_infer_request(data, k), lambda k: split_native(data, split, k)):  # type: ignore[arg-type]
        for known in ((), _Everything()):
            try:
                w: WireInferRequest = parse(known)
            except DecodeError:
                outcomes.append("DecodeError")
                continue
            fields = w.request.SerializeToString() if w.key is None or w.key not in known else None
            outcomes.append((w.key, w.client_id, [bytes(v) for v in w.raw], fields))
    assert outcomes[:2] == outcomes[2:]


class _Everything:
    """A ``known`` that knows every key."""

    def __contains__(self, _key: object) -> bool:
        return True


def message(raws: list[bytes], rid: str) -> bytes:
    req = pb.ModelInferRequest(model_name="m", model_version="2", id=rid)
    req.parameters["priority"].int64_param = 3
    for i, _ in enumerate(raws):
        req.inputs.add(name=f"IN{i}", datatype="UINT8", shape=[1, len(raws[i])])
    req.outputs.add(name="OUT")
    req.raw_input_contents.extend(raws)
    return bytes(req.SerializeToString())


MESSAGES = st.builds(message, st.lists(st.binary(max_size=40), max_size=3), st.text(max_size=8))
FIELD = st.tuples(
    st.one_of(st.sampled_from([1, 3, 7, 3 + (1 << 61), 7 + (1 << 61)]), st.integers(0, 2**70)),
    st.integers(0, 7),
    st.binary(max_size=12),
    st.booleans(),
)
"""(field number, wire type, payload, whether the length/varint is padded to 10+ bytes)."""


def encode_field(field: int, wire_type: int, payload: bytes, padded: bool) -> bytes:
    key = varint((field << 3) | wire_type)
    if wire_type == 2:
        length = varint(len(payload))
        if padded:  # NOTE: the same value in more bytes (11: over the 10-byte limit)
            length = bytes(b | 0x80 for b in length) + b"\x80" * (10 - len(length)) + b"\x00"
        return key + length + payload
    if wire_type == 0:
        return key + varint(int.from_bytes(payload[:8] or b"\0", "little"))
    return key + payload


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_valid_messages(data: bytes) -> None:
    assert _NATIVE.split_infer(data) is not None  # type: ignore[union-attr]
    check(data)


@settings(max_examples=400, deadline=None)
@given(MESSAGES, st.integers(0, 200), st.integers(0, 255), st.integers(0, 200))
def test_valid_messages_cut_or_with_a_byte_changed(
    data: bytes, at: int, byte: int, cut: int
) -> None:
    if data:
        i = at % len(data)
        check(data[:i] + bytes([byte]) + data[i + 1 :])
    check(data[: max(0, len(data) - cut)])


@settings(max_examples=400, deadline=None)
@given(st.lists(FIELD, max_size=5))
def test_hand_built_fields(fields: list[tuple[int, int, bytes, bool]]) -> None:
    check(b"".join(encode_field(*f) for f in fields))


@pytest.mark.parametrize(
    "data",
    [
        b"\x3a\x05ab",  # field 7 claims 5 bytes, 2 follow
        b"\x0a",  # field 1 with no length
        b"\xff" * 11,  # a varint over 10 bytes
        b"\x1a\x02\xff\xfe",  # an id that is not UTF-8
        b"\x1a\x01a\x3a\x01x\x1a\x01b",  # two ids around a raw entry: the last one counts
        bytes([0xBA, *[0x80] * 8, 0x02]) + b"\x00",  # a key over 64 bits: its low 64 name 7
    ],
)
def test_edges(data: bytes) -> None:
    check(data)


def in_pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (each taken modulo its length + 1), as gRPC's slices."""
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


def check_in_pieces(data: bytes, cuts: list[int]) -> None:
    """``take()``'s (data, split) of ``data`` received in pieces: the split is the one of
    ``data`` whole; the data is its bytes, or a ``Received`` of them when its raw entries
    hold ``RECEIVED_MIN_RAW_BYTES`` or more."""
    native = _NATIVE
    assert native is not None
    got, split = native.call_request(in_pieces(data, cuts))
    assert split == native.split_infer(data)
    large = split is not None and sum(n for _, n in split[3]) >= native.RECEIVED_MIN_RAW_BYTES
    if not large:
        assert type(got) is bytes
        assert got == data
        return
    assert isinstance(got, native.Received)
    assert len(got) == len(data)
    assert got.tobytes() == data
    for at, n in split[3]:
        dst = bytearray(n + 3)
        got.copy_into(dst, [(3, at, n)])
        assert dst[3:] == data[at : at + n]


@settings(max_examples=300, deadline=None)
@given(MESSAGES, st.lists(st.integers(0, 1 << 20), max_size=8))
def test_split_across_slices(data: bytes, cuts: list[int]) -> None:
    check_in_pieces(data, cuts)


@settings(max_examples=300, deadline=None)
@given(st.lists(FIELD, max_size=5), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_hand_built_fields_across_slices(
    fields: list[tuple[int, int, bytes, bool]], cuts: list[int]
) -> None:
    check_in_pieces(b"".join(encode_field(*f) for f in fields), cuts)


def large_message(sizes: list[int], rid: str, seed: int) -> bytes:
    rng = random.Random(seed)
    return message([rng.randbytes(n) for n in sizes], rid)


LARGE_MESSAGES = st.builds(
    large_message,
    st.lists(st.sampled_from([0, 7, 40_000, 65_535, 65_536, 70_001]), min_size=1, max_size=3),
    st.text(max_size=4),
    st.integers(0, 1 << 30),
)


@settings(max_examples=60, deadline=None)
@given(
    LARGE_MESSAGES,
    st.lists(st.integers(0, 1 << 20), max_size=12),
    st.integers(0, 255),
    st.integers(0, 1 << 20),
)
def test_large_messages_across_slices(data: bytes, cuts: list[int], at: int, cut: int) -> None:
    """Large raw entries (the ones left in the slices), whole, cut short (declined: bytes),
    or with one byte changed (a size or key byte: declined or split elsewhere)."""
    check_in_pieces(data, cuts)
    check_in_pieces(data[: len(data) - 1 - cut % len(data)], cuts)
    i = at % min(len(data), 64)
    check_in_pieces(data[:i] + bytes([(data[i] + 1 + at) % 256]) + data[i + 1 :], cuts)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 1 << 20), max_size=12),
    st.lists(st.tuples(st.integers(-2, 70_100), st.integers(-2, 70_100), st.integers(-2, 70_100))),
)
def test_copy_into_copies_places_or_nothing(
    cuts: list[int], places: list[tuple[int, int, int]]
) -> None:
    """``Received.copy_into``: each (at, offset, length) place copied across the slices, as
    slicing the message whole would; a place outside the message or the destination raises
    ValueError before anything is copied."""
    native = _NATIVE
    assert native is not None
    data = large_message([70_001], "r", 3)
    got, _ = native.call_request(in_pieces(data, cuts))
    assert isinstance(got, native.Received)
    dst = bytearray(70_050)
    want = bytearray(dst)
    fits = all(
        at >= 0 and off >= 0 and n >= 0 and at + n <= len(dst) and off + n <= len(data)
        for at, off, n in places
    )
    if not fits:
        with pytest.raises(ValueError, match="outside"):
            got.copy_into(dst, places)
        assert dst == want
        return
    got.copy_into(dst, places)
    for at, off, n in places:
        want[at : at + n] = data[off : off + n]
    assert dst == want


def test_received_is_made_only_by_the_native_server() -> None:
    native = _NATIVE
    assert native is not None
    with pytest.raises(TypeError):
        native.Received()
    got, _ = native.call_request([large_message([70_001], "r", 1)])
    with pytest.raises(TypeError):
        got.copy_into(b"read-only", [])
