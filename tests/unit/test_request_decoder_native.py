"""The C decoder of REQUEST records (``ipc/native/request_decoder.cc``) against the Python
one (``RequestDecoder(native=False)``): the same ``InferRequest`` for every record the
frontend writes (tails included: parameters, client output regions, a string correlation
id), a trace level left to Python, and random corruptions either decoded alike, declined, or
refused with ValueError (never a crash: run once under ASan/UBSan)."""

from __future__ import annotations

import random

import msgspec
import pytest

from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
    TraceContext,
)
from triton_mp.ipc.recordio import request_records
from triton_mp.ipc.recordio.record_layout import WIRE
from triton_mp.ipc.recordio.request_records import RequestDecoder, encode_request

native = request_records.native_decoder
pytestmark = pytest.mark.skipif(
    native is None, reason="ipc._request_decoder not built (python setup.py build_ext --inplace)"
)

NAMES = ("INPUT0", "x", "ünïcödé_入力", "a" * 300, "")


def _random_request(rnd: random.Random) -> InferRequest:
    seg = rnd.choice(("/triton_mp_1_f0_a0", "/client_key", "/ä"))
    inputs = tuple(
        TensorRef(
            rnd.choice(NAMES) + str(i),
            rnd.choice(WIRE[1:]),
            tuple(rnd.randint(-(2**63), 2**63 - 1) for _ in range(rnd.randint(0, 8))),
            seg,
            rnd.randint(0, 2**64 - 1),
            rnd.randint(0, 2**64 - 1),
            rnd.choice((0, 0, 7, 2**64 - 1)),
        )
        for i in range(rnd.randint(0, 5))
    )
    return InferRequest(
        request_id=rnd.randint(0, 2**64 - 1),
        reply_to=ReplyTo(
            rnd.choice((Requester.FRONTEND, Requester.BLS)), rnd.randint(0, 2**32 - 1)
        ),
        model=rnd.choice(NAMES),
        version=rnd.randint(-(2**63), 2**63 - 1),
        batch_size=rnd.randint(0, 2**32 - 1),
        inputs=inputs,
        outputs=tuple(rnd.choice(NAMES) + str(i) for i in range(rnd.randint(0, 4))),
        block=BlockRef(seg, rnd.randint(0, 2**64 - 1), rnd.randint(0, 2**32 - 1)),
        arrival_ns=rnd.randint(0, 2**64 - 1),
        priority=rnd.randint(0, 2**32 - 1),
        timeout_us=rnd.randint(0, 2**32 - 1),
        client_id=rnd.choice(("", "req-1", "ïd")),
        sequence_id=rnd.randint(0, 2**64 - 1),
        sequence_flags=rnd.randint(0, 3),
    )


def _random_tailed_request(rnd: random.Random) -> InferRequest:
    """A random request with a tail: parameters, client output regions (some outputs to the
    arena: None) or a string correlation id, alone or together."""
    req = _random_request(rnd)
    regions = tuple(
        rnd.choice((None, OutputRegion("/client_out", rnd.randint(1, 2**63), 64 * i, 4096, "ö")))
        for i in range(len(req.outputs))
    )
    tail: dict[str, object] = {}
    while not tail:
        if regions and rnd.random() < 0.6:
            tail["output_regions"] = regions
        if rnd.random() < 0.4:
            tail["parameters_json"] = rnd.choice(('{"p": 1}', '{"ï": "x"}'))
        if rnd.random() < 0.3:
            tail["sequence_id"] = rnd.choice(("corr-ï", "7"))
    return InferRequest(**{**{f: getattr(req, f) for f in req.__struct_fields__}, **tail})


RARE_FORMS = pytest.mark.parametrize(
    "rare",
    [
        {"parameters_json": '{"p": 1}'},
        {"sequence_id": "corr-7"},
        {"trace": TraceContext(4)},
    ],
    ids=["tail", "string sequence id", "trace"],
)
"""The forms the scheduler's header reader leaves to Python: a tail, a string sequence id, a
trace level (``test_request_header_native``)."""

TAIL_FORMS = pytest.mark.parametrize(
    "rare",
    [
        {"parameters_json": '{"p": 1}'},
        {"sequence_id": "corr-7"},
        {"output_regions": (OutputRegion("/client_out", 3, 0, 1 << 20, "out"), None)},
    ],
    ids=["parameters", "string sequence id", "client output regions"],
)
"""The forms with a tail (msgpack ``RequestTail``), which the C decoder reads through the
Python ``tail_of``."""


def _rare_request(rare: dict[str, object]) -> InferRequest:
    """A random request with ``rare``'s fields set (one of ``RARE_FORMS``)."""
    req = _random_request(random.Random(1))
    return InferRequest(**{**{f: getattr(req, f) for f in req.__struct_fields__}, **rare})


def test_every_record_decodes_as_in_python() -> None:
    rnd = random.Random(34)
    python = RequestDecoder(native=False)
    for _ in range(500):
        req = _random_request(rnd)
        rec = encode_request(req)
        assert rec is not None
        got = native.decode(rec)
        assert got == req
        assert python.decode(rec) == got
        assert native.decode(memoryview(rec)) == req  # a ring record is read in place


@TAIL_FORMS
def test_the_forms_with_a_tail_decode_in_c_as_in_python(rare: dict[str, object]) -> None:
    req = _rare_request(rare)
    rec = encode_request(req)
    assert rec is not None
    got = native.decode(rec)
    assert got is not None
    assert got == req
    assert got == RequestDecoder(native=False).decode(rec)
    assert native.decode(rec) == got  # NOTE: the second one takes the kept tail


def test_a_trace_level_is_left_to_python() -> None:
    req = _rare_request({"trace": TraceContext(4)})
    rec = encode_request(req)
    assert rec is not None
    assert native.decode(rec) is None
    got = RequestDecoder().decode(rec)
    assert got == RequestDecoder(native=False).decode(rec)
    assert got.inputs == req.inputs


def test_a_tail_that_is_no_request_tail_is_refused() -> None:
    req = _rare_request({"parameters_json": '{"p": 1}'})
    rec = bytearray(encode_request(req) or b"")
    rec[-1] ^= 0xFF  # NOTE: the tail is the record's last bytes
    with pytest.raises(msgspec.DecodeError):  # NOTE: a ValueError
        native.decode(bytes(rec))
    with pytest.raises(msgspec.DecodeError):
        RequestDecoder(native=False).decode(bytes(rec))


def test_every_record_with_a_tail_decodes_as_in_python() -> None:
    rnd = random.Random(37)
    python = RequestDecoder(native=False)
    for _ in range(500):
        req = _random_tailed_request(rnd)
        rec = encode_request(req)
        assert rec is not None
        got = native.decode(rec)
        assert got == req
        assert python.decode(rec) == got
        assert native.decode(memoryview(rec)) == req


@pytest.mark.parametrize("tailed", [False, True], ids=["no tail", "tail"])
def test_corrupted_records_decode_alike_or_are_refused(tailed: bool) -> None:
    rnd = random.Random(35)
    make = _random_tailed_request if tailed else _random_request
    decoded = refused = 0
    for _ in range(3000):
        rec = bytearray(encode_request(make(rnd)) or b"")
        for _ in range(rnd.randint(1, 4)):
            at = rnd.randrange(len(rec))
            rec[at] = rnd.randrange(256)
        if rnd.random() < 0.2:
            del rec[rnd.randrange(len(rec)) :]
        data = bytes(rec)
        try:
            got = native.decode(data)
        except ValueError:
            refused += 1
            continue
        if got is not None:
            decoded += 1
            assert RequestDecoder(native=False).decode(data) == got
    assert decoded > 100
    assert refused > 100


def test_not_a_request_record_is_refused() -> None:
    rec = encode_request(_random_request(random.Random(2)))
    assert rec is not None
    for bad in (
        b"",
        rec[:50],
        b"\x00" + rec[1:],
        rec[:1] + b"\x02" + rec[2:],
        rec[:2] + b"\x01\x00" + rec[4:],
    ):
        with pytest.raises(ValueError, match="malformed request record"):
            native.decode(bad)
