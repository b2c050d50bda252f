"""``_native.known_regions_*`` and the region part of a lesson (``known_regions.h``), without
a server, over ``test_known_submit``'s arena and ring in plain memory. A call whose inputs
mix raw entries and windows in clients' regions leaves the record the Python lane writes
(``known_records.patch_in_python``: every entry patched, a window's with its own offset) and
copies only the raw entries; each call sent counts a use of each region it holds until it
is released; a registration change (``known_regions_changed``) forgets every lesson, and a
lesson taught at another generation is refused (stale) with nothing done."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_known_submit import UNKNOWN, Rig, native
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.dispatch.known_records import patch_in_python
from triton_mp.frontend.native import input_arena_type
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.recordio.request_records import encode_request
from triton_mp.ipc.tensor_pool import BLOCK_HEADER_BYTES, align

pytestmark = pytest.mark.skipif(input_arena_type() is None, reason="native extension not built")

STALE = 6
"""``known_submit.h`` KnownResult::kStale."""

Spec = tuple[str, int, int]
"""An input: ("raw", byte size, 0) or ("window", offset in the region, byte size)."""

REGION_ID = 5 * 256 + 1
OUT_REGION_ID = 6 * 256 + 1


def message(specs: list[Spec], raws: list[bytes], client_id: str = "c") -> bytes:
    """A ModelInferRequest of UINT8 inputs: a raw entry per "raw" spec, the window's
    parameters for the others, one output in a region."""
    req = pb.ModelInferRequest(model_name="m", id=client_id)
    for i, (kind, a, b) in enumerate(specs):
        t = req.inputs.add(name=f"IN{i}", datatype="UINT8", shape=[a if kind == "raw" else b])
        if kind == "window":
            t.parameters["shared_memory_region"].string_param = "in"
            t.parameters["shared_memory_offset"].int64_param = a
            t.parameters["shared_memory_byte_size"].int64_param = b
    out = req.outputs.add(name="OUT")
    out.parameters["shared_memory_region"].string_param = "out"
    out.parameters["shared_memory_byte_size"].int64_param = 64
    req.raw_input_contents.extend(raws)
    return bytes(req.SerializeToString())


def descriptor(
    specs: list[Spec], rid: int, arrival: int, offset: int, generation: int
) -> InferRequest:
    """What Python sends for ``message(specs, ...)`` in a block at ``offset``
    (``write_known``'s layout: the raw entries packed, the windows named)."""
    pos = offset + BLOCK_HEADER_BYTES
    refs = []
    for i, (kind, a, b) in enumerate(specs):
        if kind == "window":
            refs.append(TensorRef(f"IN{i}", "UINT8", (b,), "/client_in", a, b, REGION_ID))
            continue
        refs.append(TensorRef(f"IN{i}", "UINT8", (a,), "/arena", pos, a))
        pos += align(a)
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 0),
        model="m",
        version=1,
        batch_size=1,
        inputs=tuple(refs),
        outputs=("OUT",),
        block=BlockRef("/arena", offset, generation),
        arrival_ns=arrival,
        client_id="c",
        output_regions=(OutputRegion("OUT", "/client_out", 0, 64, OUT_REGION_ID),),
    )


def teach(specs: list[Spec], generation: int | None = None, lesson: int = 9) -> tuple[bytes, Any]:
    """Teach ``message(specs)``'s key as ``known_teach.NativeKnown.offer`` does; returns
    (the template, the held region ids)."""
    n = native()
    raws = [b"\0" * a for kind, a, _ in specs if kind == "raw"]
    key = n.split_infer(message(specs, raws))[1]
    template = encode_request(descriptor(specs, 1, 5, 0, 1))
    assert template is not None
    sizes = [a for kind, a, _ in specs if kind == "raw"]
    at = list(itertools.accumulate((align(s) for s in sizes), initial=0))[:-1]
    entries = tuple(None if kind == "raw" else a for kind, a, _ in specs)
    held = (REGION_ID,) * (len(specs) - len(sizes)) + (OUT_REGION_ID,)
    block_bytes = BLOCK_HEADER_BYTES + align(max(sum(align(s) for s in sizes), 1))
    gen = n.known_regions_generation() if generation is None else generation
    args = (key, b"c", lesson, sizes, at, block_bytes, template, 0, entries, held, gen)
    assert n.known_teach(*args)
    return template, held


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


specs_drawn = st.lists(
    st.one_of(
        st.tuples(st.just("raw"), st.integers(0, 200), st.just(0)),
        st.tuples(st.just("window"), st.integers(0, 4096), st.integers(1, 300)),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(specs=specs_drawn, calls=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_a_call_naming_regions_is_what_the_python_lane_writes(
    specs: list[Spec], calls: int, seed: int
) -> None:
    r = Rig()
    n = native()
    held_before = n.known_regions_held()
    try:
        template, held = teach(specs)
        rng = np.random.default_rng(seed)
        for k in range(calls):
            sizes = [a for kind, a, _ in specs if kind == "raw"]
            raws = [rng.integers(0, 256, a, np.uint8).tobytes() for a in sizes]
            sent = n.known_submit(message(specs, raws), 1000 + k)
            assert isinstance(sent, tuple), sent
            rid, lesson, offset, generation = sent
            assert lesson == 9
            desc = descriptor(specs, rid, 1000 + k, offset, generation)
            expected = patch_in_python(template, rid, 1000 + k, desc.block, desc.inputs)
            assert r.ring_seg.records()[k] == expected == encode_request(desc)
            raw_refs = [ref for ref in desc.inputs if not ref.region_id]
            for ref, raw in zip(raw_refs, raws, strict=True):
                assert r.arena_seg.buf[ref.offset : ref.offset + ref.nbytes] == raw
        # NOTE: each call holds every region it names, until released
        assert n.known_regions_uses(OUT_REGION_ID) == calls
        assert n.known_regions_held() == held_before + calls * len(held)
        for _ in range(calls):
            n.known_regions_release(held)
        assert n.known_regions_uses(OUT_REGION_ID) == 0
        assert n.known_regions_held() == held_before
    finally:
        r.close()


def test_a_registration_change_forgets_and_a_stale_lesson_is_refused(rig: Rig) -> None:
    n = native()
    specs: list[Spec] = [("window", 0, 16)]
    teach(specs)
    assert isinstance(n.known_submit(message(specs, []), 1), tuple)
    uses = n.known_regions_uses(REGION_ID)
    stats = n.known_stats()
    n.known_regions_changed()
    assert n.known_stats()["cleared"] == stats["cleared"] + 1
    assert n.known_submit(message(specs, []), 2) == UNKNOWN  # forgotten
    # NOTE: a lesson taught from a decision made before the change is never used
    teach(specs, generation=n.known_regions_generation() - 1)
    records = len(rig.ring_seg.records())
    assert n.known_submit(message(specs, []), 3) == STALE
    assert n.known_stats()["stale"] == stats["stale"] + 1
    assert len(rig.ring_seg.records()) == records
    assert n.known_regions_uses(REGION_ID) == uses
    n.known_regions_release((REGION_ID, OUT_REGION_ID))
    assert n.known_regions_uses(REGION_ID) == uses - 1


def test_a_lesson_whose_entries_do_not_name_its_raw_inputs_is_refused(rig: Rig) -> None:
    n = native()
    specs: list[Spec] = [("raw", 8, 0), ("window", 0, 16)]
    raws = [b"\0" * 8]
    key = n.split_infer(message(specs, raws))[1]
    template = encode_request(descriptor(specs, 1, 5, 0, 1))
    gen = n.known_regions_generation()
    base = (key, b"c", 3, [8], [0], 128, template, 0)
    assert not n.known_teach(*base, (0, 16), (REGION_ID,), gen)  # no raw entry named
    assert not n.known_teach(*base, (None, None), (REGION_ID,), gen)  # two raw entries
    assert n.known_teach(*base, (None, 0), (REGION_ID,), gen)
    # NOTE: releasing what was never held changes nothing (SystemShmRegistry.release)
    n.known_regions_release((12345,))
    assert n.known_regions_uses(12345) == 0
