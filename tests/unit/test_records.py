"""The binary ring records (ipc.recordio.records) and their C twin (ipc/records.h): every offset the
native side relies on is pinned here, and each message survives a round trip."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BatchAssign,
    BlockRef,
    CancelRequest,
    ErrorInfo,
    Handoff,
    InferRequest,
    InferResponse,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
    ToFrontend,
    ToScheduler,
    ToWorker,
    TraceContext,
    TraceRecord,
)
from triton_mp.ipc.recordio import record_layout as layout
from triton_mp.ipc.recordio import records
from triton_mp.ipc.recordio.codec import Decoder, encode

HEADER = Path(records.__file__).parents[1] / "records.h"  # NOTE: ipc/records.h, beside ipc/native/


def _request(**kw: object) -> InferRequest:
    fields: dict[str, object] = dict(
        request_id=7,
        reply_to=ReplyTo(Requester.FRONTEND, 3),
        model="add_sub_py",
        version=1,
        batch_size=1,
        inputs=(
            TensorRef("INPUT0", "FP32", (1, 16), "/triton_mp_1_f3_a0", 4160, 64),
            TensorRef("INPUT1", "BYTES", (1, 2), "clientkey", 128, 12, region_id=5),
        ),
        outputs=("OUTPUT0", "OUTPUT1"),
        block=BlockRef("/triton_mp_1_f3_a0", 4096, 0xDEADBEEF),
        arrival_ns=123456789012,
    )
    fields.update(kw)
    return InferRequest(**fields)  # type: ignore[arg-type]


def test_layout_offsets_match_the_c_header() -> None:
    """The struct formats give the sizes and offsets records.h asserts."""
    assert layout.REQUEST_HEADER.size == 104
    assert layout.TENSOR_ENTRY.size == 104
    assert layout.ANSWERS_HEADER.size == 48
    assert layout.RESPONSE_ENTRY.size == 48
    text = HEADER.read_text()
    for name, size in (
        ("RequestHeader", 104),
        ("TensorEntry", 104),
        ("OutputEntry", 8),
        ("AnswersHeader", 48),
        ("ResponseEntry", 48),
    ):
        assert f"static_assert(sizeof({name}) == {size});" in text
    # NOTE: every field comment in the header names its offset; the Python formats put the
    # same field there (checked by packing a distinct value per field and reading it back).
    req = records.encode_request(_request(priority=9, timeout_us=77, sequence_id=42))
    assert req is not None
    assert req[0] == 0xC1
    assert req[1] == layout.KIND_REQUEST
    assert int.from_bytes(req[8:16], "little") == 7
    assert int.from_bytes(req[24:32], "little") == 42
    assert int.from_bytes(req[40:48], "little") == 4096
    assert int.from_bytes(req[48:52], "little") == 3
    assert int.from_bytes(req[56:60], "little") == 77
    assert int.from_bytes(req[60:64], "little") == 9
    assert int.from_bytes(req[66:68], "little") == 2
    assert int.from_bytes(req[4:8], "little") == len(req)
    assert int.from_bytes(req[96:100], "little") == 0xDEADBEEF
    assert "static_assert(offsetof(RequestHeader, block_generation) == 96);" in text
    entry = req[104:208]
    assert int.from_bytes(entry[0:8], "little") == 4160
    assert entry[30] == 11  # FP32
    assert entry[31] == 2  # two dims
    assert int.from_bytes(entry[48:56], "little") == 16
    name_off = int.from_bytes(entry[24:28], "little")
    assert req[name_off : name_off + 6] == b"INPUT0"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_c_header_compiles_with_the_team_flags(tmp_path: Path) -> None:
    src = tmp_path / "t.cc"
    src.write_text(f'#include "{HEADER}"\nint main() {{ return 0; }}\n')
    subprocess.run(
        ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "t"), str(src)],
        check=True,
    )


def test_header_constants_match_python() -> None:
    text = HEADER.read_text()

    def const(name: str) -> int:
        m = re.search(rf"{name} = (0x[0-9A-Fa-f]+|\d+);", text)
        assert m, name
        return int(m.group(1), 0)

    assert const("kRecordMarker") == layout.MARKER
    assert const("kRecordVersion") == layout.VERSION
    assert const("kReqSeqString") == layout.SEQ_STRING
    assert const("kReqTraceMask") == layout.TRACE_MASK
    assert const("kRespNamesBlock") == layout.NAMES_BLOCK
    assert const("kRespEmpty") == layout.EMPTY


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"sequence_id": 2**64 - 1, "sequence_flags": 3, "priority": 2, "timeout_us": 1000},
        {"sequence_id": "seq-é", "sequence_flags": 1, "client_id": "my id"},
        {"parameters_json": '{"k": 1}', "trace": TraceContext(4)},
        {
            "output_regions": (
                OutputRegion("key", 2, 0, 64, "reg"),
                None,
            )
        },
        {"reply_to": ReplyTo(Requester.BLS, 12), "inputs": ()},
    ],
)
def test_request_round_trip(kw: dict[str, object]) -> None:
    req = _request(**kw)
    data = records.encode_request(req)
    assert data is not None
    decode = records.record_decoder(Decoder(ToScheduler).decode_buffer)
    got = decode(memoryview(data))
    assert records.as_request(got) == req
    assert records.decode_request(data) == req
    for name in ("request_id", "reply_to", "model", "version", "batch_size", "arrival_ns"):
        assert getattr(got, name) == getattr(req, name)
    assert (got.priority, got.timeout_us, got.sequence_id) == (
        req.priority,
        req.timeout_us,
        req.sequence_id,
    )
    assert got.sequence_flags == req.sequence_flags
    assert got.inputs == req.inputs
    assert got.client_id == req.client_id


def test_a_plain_record_stays_undecoded_until_asked() -> None:
    """The scheduler reads the header only; the worker gets the record's bytes verbatim."""
    data = records.encode_request(_request())
    assert data is not None
    got = records.record_decoder(Decoder(ToScheduler).decode_buffer)(memoryview(data))
    assert isinstance(got, records.RequestRecord)
    assert records.wire_form(got) == data
    traced = records.encode_request(_request(trace=TraceContext(4)))
    assert traced is not None
    assert isinstance(
        records.record_decoder(Decoder(ToScheduler).decode_buffer)(traced), InferRequest
    )


def test_a_batch_assign_carries_records_verbatim() -> None:
    data = records.encode_request(_request())
    assert data is not None
    plain = _request(request_id=8, reply_to=ReplyTo(Requester.BLS, 1))
    assign = BatchAssign(batch_id=1, requests=(data, plain), dispatch_ns=5)
    back = Decoder(ToWorker).decode(encode(assign))
    assert isinstance(back, BatchAssign)
    assert records.decoded_batch(back).requests == (_request(), plain)


def test_requests_the_record_cannot_say_go_as_msgpack() -> None:
    deep = TensorRef("X", "FP32", (1,) * 9, "/s", 0, 4)
    assert records.encode_request(_request(inputs=(deep,))) is None
    ens = _request(reply_to=ReplyTo(Requester.ENSEMBLE, 0))
    assert records.encode_request(ens) is None
    assert records.encode_request(_request(client_id="x" * 70000)) is None


def test_msgpack_messages_still_decode_beside_records() -> None:
    decode = records.record_decoder(Decoder(ToScheduler).decode_buffer)
    cancel = CancelRequest(
        request_id=1, reply_to=ReplyTo(Requester.FRONTEND, 0), model="m", version=1
    )
    assert decode(memoryview(encode(cancel))) == cancel


def _out(name: str, seg: str, off: int) -> TensorRef:
    return TensorRef(name, "INT64", (2, 3), seg, off, 48)


def test_answer_batch_round_trip() -> None:
    block = BlockRef("/triton_mp_1_w0p9_a0", 1024, 2**32 - 1)
    shared = (block,)
    batch = AnswerBatch(
        responses=(
            InferResponse(
                request_id=1,
                version=2,
                outputs=(_out("O", block.segment, 1088),),
                shared_blocks=shared,
                parameters_json='{"a": true}',
            ),
            InferResponse(
                request_id=2,
                version=2,
                error=ErrorInfo(ErrorCode.INVALID_ARG, "too small", "worker m_0"),
            ),
            InferResponse(
                request_id=3,
                version=2,
                outputs=(
                    _out("O", block.segment, 1152),
                    TensorRef("P", "INT64", (2, 3), "clientkey", 0, 48, region_id=4),
                ),
                shared_blocks=shared,
            ),
        ),
        handoffs=(Handoff(block, 2),),
    )
    data = records.encode_answer(batch)
    assert data is not None
    assert int.from_bytes(data[40:44], "little") == 2**32 - 1  # AnswersHeader.block_generation
    decode = records.record_decoder(Decoder(ToFrontend).decode_buffer)
    assert decode(memoryview(data)) == batch


def test_single_response_owns_its_block() -> None:
    block = BlockRef("/seg", 64, 3)
    one = InferResponse(request_id=9, version=1, outputs=(_out("O", "/seg", 128),), block=block)
    data = records.encode_answer(one)
    assert data is not None
    assert records.decode_answer(data) == one
    final = InferResponse(request_id=9, version=1, empty=True)
    assert records.decode_answer(records.encode_answer(final)) == final  # type: ignore[arg-type]
    partial = InferResponse(request_id=9, version=1, final=False, outputs=(), block=None)
    assert records.decode_answer(records.encode_answer(partial)) == partial  # type: ignore[arg-type]


def test_answers_the_record_cannot_say_go_as_msgpack() -> None:
    traced = InferResponse(request_id=1, version=1, trace=TraceRecord())
    assert records.encode_answer(traced) is None
    extra = InferResponse(request_id=1, version=1, extra_blocks=(BlockRef("/s", 0),))
    assert records.encode_answer(extra) is None
    long_origin = ErrorInfo(ErrorCode.INTERNAL, "m", "o" * 70000)
    assert records.encode_answer(InferResponse(request_id=1, version=1, error=long_origin)) is None


def test_records_of_one_form_decode_each_its_own_numbers() -> None:
    """The decoder keeps what a form's records share; ids, offsets and shapes are each
    record's own, and a new client id or tensor name is a new form."""
    dec = records.RequestDecoder()
    first = _request(request_id=1, arrival_ns=10, batch_size=1)
    seg = "/triton_mp_1_f3_a0"
    second = _request(
        request_id=2,
        arrival_ns=20,
        batch_size=3,
        inputs=(
            TensorRef("INPUT0", "FP32", (3, 16), seg, 9000, 192),
            TensorRef("INPUT1", "BYTES", (3, 2), "clientkey", 256, 36, region_id=5),
        ),
        block=BlockRef(seg, 8192, 12),
    )
    third = _request(request_id=3, client_id="other")
    renamed = _request(inputs=(TensorRef("IN", "FP32", (1, 16), seg, 64, 64),))
    for req in (first, second, first, third, renamed, second):
        data = records.encode_request(req)
        assert data is not None
        assert dec.decode(data) == req
