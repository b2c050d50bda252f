"""``frontend.dispatch.known_records``: a known request's record patched from its form's
template is, byte for byte, the record ``ipc.recordio.request_records.encode_request`` writes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.frontend.dispatch.known_records import FORMS_KEPT, keep, patch_in_python
from triton_mp.frontend.native import record_patch
from triton_mp.ipc.protocol.messages import BlockRef, InferRequest, ReplyTo, Requester, TensorRef
from triton_mp.ipc.recordio.quiet_requests import request_bit
from triton_mp.ipc.recordio.request_records import encode_request

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
FORM = st.fixed_dictionaries(
    {
        "model": st.text(min_size=1, max_size=12),
        "version": st.integers(1, 9),
        "batch_size": st.integers(1, 8),
        "priority": st.integers(0, 5),
        "timeout_us": U32,
        "client_id": st.text(max_size=20),
        "segment": st.text(min_size=1, max_size=30),
        "inputs": st.lists(
            st.tuples(
                st.text(min_size=1, max_size=8),
                st.sampled_from(["FP32", "INT64", "UINT8", "BOOL"]),
                st.lists(st.integers(0, 99), max_size=4).map(tuple),
                st.integers(0, 2**20),
                st.integers(0, 3),  # 0: in the arena, else a client region's id
            ),
            min_size=1,
            max_size=4,
        ),
        "outputs": st.lists(st.text(min_size=1, max_size=8), max_size=3).map(tuple),
    }
)
NATIVE = record_patch()
SENT = st.tuples(U64, U64, U64, st.integers(1, 2**32 - 1), st.lists(U64, min_size=4, max_size=4))
"""Per request: id, arrival, block offset, block generation, input offsets."""


def request(form: dict, sent: tuple) -> InferRequest:  # type: ignore[type-arg]
    rid, arrival_ns, block_offset, generation, offsets = sent
    block = BlockRef(form["segment"], block_offset, generation)
    inputs = tuple(
        TensorRef(name, dtype, shape, form["segment"] if not region else "/client", off, n, region)
        for (name, dtype, shape, n, region), off in zip(form["inputs"], offsets, strict=False)
    )
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 3),
        model=form["model"],
        version=form["version"],
        batch_size=form["batch_size"],
        inputs=inputs,
        outputs=form["outputs"],
        block=block,
        arrival_ns=arrival_ns,
        priority=form["priority"],
        timeout_us=form["timeout_us"],
        client_id=form["client_id"],
    )


@settings(max_examples=300, deadline=None)
@given(FORM, SENT, SENT)
def test_a_patched_record_is_the_encoders_record(form: dict, first: tuple, later: tuple) -> None:  # type: ignore[type-arg]
    template = encode_request(request(form, first))
    assert template is not None
    desc = request(form, later)
    expected = encode_request(desc)
    args = (template, desc.request_id, desc.arrival_ns, desc.block, desc.inputs)
    assert patch_in_python(*args) == expected
    if NATIVE is not None:
        assert NATIVE(*args) == expected
    templates: dict[tuple[str, str], tuple[bytes, int]] = {}
    keep(templates, ("/seg", ""), template)
    # NOTE: the kept bit is the one HeldWakes.send would compute for every patched record
    assert templates[("/seg", "")] == (template, request_bit(expected))


def test_templates_are_kept_per_form_and_cleared_whole_when_full() -> None:
    templates: dict[tuple[str, str], tuple[bytes, int]] = {}
    for i in range(FORMS_KEPT):
        keep(templates, ("/seg", str(i)), b"r%d" % i)
    assert len(templates) == FORMS_KEPT
    keep(templates, ("/seg", "new"), b"new")
    assert templates == {("/seg", "new"): (b"new", 0)}


@pytest.mark.skipif(NATIVE is None, reason="native extension not built")
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.lists(U64, max_size=4))
def test_the_native_patch_writes_only_inside_the_template(template: bytes, offsets: list) -> None:  # type: ignore[type-arg]
    """Any bytes as a template: patched as Python patches them, or refused (ValueError, where
    Python's struct raises) when shorter than the header and the entries."""
    assert NATIVE is not None
    block = BlockRef("/seg", 2**64 - 1, 2**32 - 1)
    refs = [TensorRef("x", "FP32", (1,), "/seg", off, 4) for off in offsets]
    try:
        expected = patch_in_python(template, 1, 2, block, refs)
    except struct.error:
        with pytest.raises(ValueError, match="shorter"):
            NATIVE(template, 1, 2, block, refs)
    else:
        assert NATIVE(template, 1, 2, block, refs) == expected
    with pytest.raises(OverflowError):
        NATIVE(bytes(400), 1, 2, BlockRef("/seg", 0, 2**32), refs)
