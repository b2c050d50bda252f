"""The scheduler's C reader of REQUEST headers (``read_header`` in
``ipc/native/request_decoder.cc``) against the Python one (``HeaderReader(native=False)``):
the same ``RequestRecord`` slots for every record the frontend writes, the rare forms left to
Python, and random corruptions read alike or refused alike (never a crash: run once under
ASan/UBSan)."""

from __future__ import annotations

import random
import struct

import pytest

from tests.unit.test_request_decoder_native import _random_request, _rare_request
from triton_mp.ipc.protocol.messages import InferRequest, OutputRegion, TraceContext
from triton_mp.ipc.recordio import request_records
from triton_mp.ipc.recordio.request_records import HeaderReader, RequestRecord, encode_request

native = request_records.native_decoder
pytestmark = pytest.mark.skipif(
    native is None, reason="ipc._request_decoder not built (python setup.py build_ext --inplace)"
)

SLOTS = (
    "raw", "request_id", "reply_to", "model", "version", "batch_size", "arrival_ns",
    "priority", "timeout_us", "sequence_id", "sequence_flags",
)  # fmt: skip


def _slots(rec: object) -> tuple[object, ...]:
    assert type(rec) is RequestRecord
    return tuple(getattr(rec, s) for s in SLOTS)


def _record(seed: int) -> bytes:
    rec = encode_request(_random_request(random.Random(seed)))
    assert rec is not None
    return rec


def test_every_header_reads_as_in_python() -> None:
    python = HeaderReader(native=False).read
    for seed in range(500):
        data = _record(seed)
        got = native.read_header(data)
        assert _slots(got) == _slots(python(data))
        assert _slots(native.read_header(memoryview(data))) == _slots(got)  # read in place
        assert got.full() == request_records.RequestDecoder(native=False).decode(data)


def test_the_record_owns_a_copy_of_the_ring_bytes() -> None:
    buf = bytearray(_record(3))
    got = native.read_header(memoryview(buf))
    buf[:] = bytes(len(buf))
    assert got.raw == _record(3)


@pytest.mark.parametrize(
    "rare",
    [{"sequence_id": "corr-7"}, {"trace": TraceContext(4)}],
    ids=["string sequence id", "trace"],
)
def test_the_rare_forms_are_left_to_python(rare: dict[str, object]) -> None:
    rec = encode_request(_rare_request(rare))
    assert rec is not None
    assert native.read_header(rec) is None
    got = HeaderReader().read(rec)
    assert type(got) is InferRequest
    assert got == HeaderReader(native=False).read(rec)


@pytest.mark.parametrize(
    "tail",
    [
        {"parameters_json": '{"p": 1}'},
        {"output_regions": (OutputRegion("/client_out", 3, 0, 1 << 20, "out"), None)},
    ],
    ids=["parameters", "client output regions"],
)
def test_a_tail_stays_in_the_record_bytes(tail: dict[str, object]) -> None:
    """A tail schedules nothing: its record reads as a header (in C and in Python alike),
    and the whole request, tail included, is the record's own on first use."""
    req = _rare_request(tail)
    rec = encode_request(req)
    assert rec is not None
    got = native.read_header(rec)
    assert type(got) is RequestRecord
    assert _slots(got) == _slots(HeaderReader(native=False).read(rec))
    assert got.raw == rec
    assert got.full() == req


def test_a_tail_outside_its_record_is_refused_alike() -> None:
    rec = encode_request(_rare_request({"parameters_json": '{"p": 1}'}))
    assert rec is not None
    (tail_off,) = struct.unpack_from("<I", rec, 88)
    for off, length in ((len(rec) + 1, 4), (tail_off, len(rec))):
        bad = bytearray(rec)
        struct.pack_into("<II", bad, 88, off, length)
        assert native.read_header(bytes(bad)) is None
        for read in (HeaderReader().read, HeaderReader(native=False).read):
            with pytest.raises(ValueError, match="its tail lies outside the record"):
                read(bytes(bad))


def _outcome(read: object, data: bytes) -> object:
    try:
        got = read(data)  # type: ignore[operator]
    except (ValueError, IndexError, struct.error) as e:  # NOTE: record_decoder: DecodeError
        return ("refused", type(e) is UnicodeDecodeError)
    return _slots(got) if type(got) is RequestRecord else got


def test_corrupted_headers_read_alike_or_are_refused_alike() -> None:
    rnd = random.Random(36)
    with_c, python = HeaderReader().read, HeaderReader(native=False).read
    records = refused = 0
    for seed in range(3000):
        rec = bytearray(_record(seed))
        for _ in range(rnd.randint(1, 4)):
            at = rnd.randrange(min(len(rec), 120))
            rec[at] = rnd.randrange(256)
        if rnd.random() < 0.2:
            del rec[rnd.randrange(len(rec)) :]
        data = bytes(rec)
        got = _outcome(with_c, data)
        assert got == _outcome(python, data)
        records += isinstance(got, tuple) and got[0] != "refused"
        refused += isinstance(got, tuple) and got[0] == "refused"
    assert records > 1000
    assert refused > 100


def test_a_short_record_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter than its header"):
        native.read_header(_record(2)[:50])


def test_only_a_class_with_the_slots_is_configured() -> None:
    class NoSlots:
        pass

    class NotSlots:
        raw = request_id = reply_to = model = version = batch_size = arrival_ns = None
        priority = timeout_us = sequence_id = sequence_flags = _full = None

    class Sub(RequestRecord):
        __slots__ = ()

    with pytest.raises(AttributeError):
        native.configure_header(NoSlots)
    for cls in (NotSlots, Sub):
        with pytest.raises(TypeError, match="slot"):
            native.configure_header(cls)
    with pytest.raises(TypeError):
        native.configure_header(1)
    native.configure_header(RequestRecord)
    assert type(native.read_header(_record(4))) is RequestRecord


def test_every_slot_of_the_class_is_filled() -> None:
    """A slot added to ``RequestRecord`` must be added to ``kHeadSlots`` in C too: a slot
    the C reader leaves unset would raise AttributeError at its first read."""
    got = native.read_header(_record(5))
    for name in RequestRecord.__slots__:
        getattr(got, name)
    assert len(RequestRecord.__slots__) == len(SLOTS) + 1  # NOTE: and _full, None until read
    assert got._full is None
