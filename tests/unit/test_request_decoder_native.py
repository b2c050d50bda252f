"""The C decoder of REQUEST records (``ipc/native/request_decoder.cc``) against the Python
one (``RequestDecoder(native=False)``): the same ``InferRequest`` for every record the
frontend writes (tails included: parameters, client output regions, a string correlation
id), a trace level left to Python, and random corruptions either decoded alike, declined, or
refused with ValueError (never a crash: run once under ASan/UBSan)."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_decode_all_is_the_loop_over_the_batch() -> None:
    """``decode_all`` (``BatchRequests.decoded``'s C twin): records decoded, messages as they
    are, a traced record through the fallback only, in batch order."""
    rnd = random.Random(38)
    python = RequestDecoder(native=False)
    fallen: list[bytes] = []

    def fallback(rec: bytes) -> InferRequest:
        fallen.append(rec)
        return python.decode(rec)

    for _ in range(200):
        reqs = [
            rnd.choice((_random_request, _random_tailed_request))(rnd)
            for _ in range(rnd.randint(0, 6))
        ]
        traced = {i for i in range(len(reqs)) if rnd.random() < 0.15}
        reqs = [
            msgspec.structs.replace(r, trace=TraceContext(4)) if i in traced else r
            for i, r in enumerate(reqs)
        ]
        entries = tuple(r if rnd.random() < 0.2 else encode_request(r) for r in reqs)
        fallen.clear()
        got = native.decode_all(entries, fallback)
        assert type(got) is tuple
        assert got == tuple(reqs)
        for e, g in zip(entries, got, strict=True):
            if not isinstance(e, bytes):
                assert g is e
        assert fallen == [e for i, e in enumerate(entries) if i in traced and isinstance(e, bytes)]


def test_decode_all_refuses_a_malformed_record() -> None:
    rec = encode_request(_random_request(random.Random(3)))
    assert rec is not None
    with pytest.raises(ValueError, match="malformed request record"):
        native.decode_all((rec, rec[:50]), RequestDecoder(native=False).decode)


_SITE_STRINGS = st.sampled_from(("INPUT0", "INPUT1", "INPUT", "é", "ab", "", "a" * 40, "\x00"))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            _SITE_STRINGS,
            _SITE_STRINGS,
            _SITE_STRINGS,
            st.lists(st.integers(-2, 2**63 - 1), max_size=9),
            st.integers(0, 9),
        ),
        min_size=2,
        max_size=12,
    )
)
def test_strings_and_shapes_kept_from_the_last_record_are_never_stale(
    forms: list[tuple[str, str, str, list[int], int]],
) -> None:
    """Consecutive records with the same or nearly the same names, segments and shapes at
    each place (the decoder keeps the last ones and reuses them when the bytes match):
    each decodes as the Python decoder decodes it."""
    python = RequestDecoder(native=False)
    for name, segment, other, dims, n in forms:
        shape = tuple(dims[:8])
        inputs = tuple(
            TensorRef(name if i % 2 else other, "FP32", shape[: 8 - i % 3], segment, i, 4)
            for i in range(n)
        )
        req = InferRequest(
            request_id=1,
            reply_to=ReplyTo(Requester.FRONTEND, 0),
            model=other,
            version=1,
            batch_size=1,
            inputs=inputs,
            outputs=tuple(name + str(i % 2) for i in range(n)),
            block=BlockRef(segment, 0),
            arrival_ns=1,
            client_id=name,
        )
        rec = encode_request(req)
        assert rec is not None
        got = native.decode(rec)
        assert got == req
        assert got == python.decode(rec)
