"""A worker's tensor I/O (``workers.tensors.tensor_io``): views over inputs, output blocks, client
regions.

No process is started: an arena of this test process stands for the worker's, a POSIX
shared-memory object of this process for a client's registered region. Objects are named
``/triton_mp_<pid>_test_tio*`` and unlinked by the fixtures that made them.
"""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Iterator

import msgspec
import numpy as np
import posix_ipc
import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.numpy_tensors import BF16_DTYPE, tensor_wire_bytes
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.tensor_pool import (
    ALIGN,
    BLOCK_HEADER_BYTES,
    ArenaAllocator,
    SegmentCache,
    block_ref,
    free_block,
)
from triton_mp.workers.tensors import tensor_io
from triton_mp.workers.tensors.private_pages import PrivatePages, map_private
from triton_mp.workers.tensors.tensor_io import (
    ClientRegions,
    free_own_block,
    request_inputs,
    view_tensor,
    wire_tensor,
    write_block,
    write_outputs,
)

PID = os.getpid()
_names = itertools.count()


@pytest.fixture
def arena() -> Iterator[ArenaAllocator]:
    alloc = ArenaAllocator(f"/triton_mp_{PID}_test_tio{next(_names)}", 1 << 16, 1 << 20)
    try:
        yield alloc
    finally:
        alloc.close_and_unlink()


@pytest.fixture
def cache(arena: ArenaAllocator) -> Iterator[SegmentCache]:
    cache = SegmentCache()
    for seg in arena.segments():
        cache.add(seg)
    try:
        yield cache
    finally:
        cache.close()


@pytest.fixture
def regions() -> Iterator[ClientRegions]:
    regions = ClientRegions()
    try:
        yield regions
    finally:
        regions.close()


@pytest.fixture
def client_object() -> Iterator[str]:
    """A 4 KiB object standing for a client's registered system shared memory."""
    key = f"/triton_mp_{PID}_test_tio_client{next(_names)}"
    obj = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=4096)
    os.close(obj.fd)
    try:
        yield key
    finally:
        posix_ipc.unlink_shared_memory(key)


def _request(
    outputs: tuple[str, ...], regions: tuple[OutputRegion | None, ...] = ()
) -> InferRequest:
    return InferRequest(
        request_id=7,
        reply_to=ReplyTo(Requester.FRONTEND, 1),
        model="m",
        version=1,
        batch_size=1,
        inputs=(),
        outputs=outputs,
        block=BlockRef("unused", 0),
        arrival_ns=0,
        output_regions=regions,
    )


def test_write_block_lays_tensors_out_aligned_and_views_read_them_back(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([b"x", b"hello"], dtype=np.object_)
    block, refs = write_block(arena, [wire_tensor("A", a), wire_tensor("B", b)])
    assert refs[0].offset == block.offset + BLOCK_HEADER_BYTES
    assert refs[1].offset == refs[0].offset + ALIGN  # 24 bytes, rounded up
    assert (refs[0].datatype, refs[0].shape, refs[0].nbytes) == ("INT32", (2, 3), 24)
    assert (refs[1].datatype, refs[1].shape, refs[1].nbytes) == ("BYTES", (2,), 4 + 1 + 4 + 5)
    np.testing.assert_array_equal(view_tensor(cache, refs[0]), a)
    assert view_tensor(cache, refs[1]).tolist() == [b"x", b"hello"]
    free_block(cache.get(block.segment), block)
    assert arena.live_blocks() == 0


def test_a_type_without_numpy_fails_the_tensor_not_the_worker(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    block, (ref,) = write_block(arena, [wire_tensor("X", np.zeros(2, np.uint16))])
    with pytest.raises(TritonMPError, match="INVALID") as e:
        view_tensor(cache, msgspec.structs.replace(ref, datatype="INVALID"))
    assert e.value.code == ErrorCode.UNSUPPORTED
    free_block(cache.get(block.segment), block)


def test_bf16_is_held_as_its_16_bit_words_both_ways(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    """numpy has no bfloat16: BF16 tensors are BF16_DTYPE arrays, bits untouched."""
    bits = np.array([[0x3F80, 0xC000], [0x7FC0, 0xFFFF]], "<u2")
    block, (ref,) = write_block(arena, [wire_tensor("X", bits)])
    arr = view_tensor(cache, msgspec.structs.replace(ref, datatype="BF16"))
    assert (arr.dtype, arr.shape) == (BF16_DTYPE, (2, 2))
    assert arr.tobytes() == bits.tobytes()
    out_block, (out,) = write_block(arena, [wire_tensor("Y", arr)])
    assert (out.datatype, out.shape, out.nbytes) == ("BF16", (2, 2), 8)
    assert view_tensor(cache, out).tobytes() == bits.tobytes()
    # NOTE: a strided view is written through its contiguous copy
    assert wire_tensor("Z", arr[:, 0])[1:3] == ("BF16", (2,))
    assert bytes(wire_tensor("Z", arr[:, 0])[3]) == bits[:, 0].tobytes()
    for b in (block, out_block):
        free_block(cache.get(b.segment), b)


def test_an_input_in_a_client_region_needs_the_mapped_regions(cache: SegmentCache) -> None:
    ref = TensorRef("X", "INT32", (1,), "/some_client_key", 0, 4, region_id=3)
    with pytest.raises(TritonMPError, match="client region"):
        view_tensor(cache, ref)


def test_outputs_go_to_their_region_or_the_arena_in_request_order(
    arena: ArenaAllocator, cache: SegmentCache, regions: ClientRegions, client_object: str
) -> None:
    region = OutputRegion(client_object, 5, 128, 64, "out_region")
    req = _request(("A", "B", "C"), (None, region, None))
    outs = {
        "A": np.array([1.5], dtype=np.float32),
        "B": np.array([1, 2, 3], dtype=np.int64),
        "C": np.array([True, False]),
    }
    msg = write_outputs(arena, regions, req, outs)
    assert [r.name for r in msg.outputs] == ["A", "B", "C"]
    a, b, c = msg.outputs
    assert (b.segment, b.offset, b.nbytes, b.region_id) == (client_object, 128, 24, 5)
    assert msg.block is not None
    assert a.segment == c.segment == msg.block.segment
    assert c.offset == a.offset + ALIGN
    np.testing.assert_array_equal(view_tensor(cache, a), outs["A"])
    np.testing.assert_array_equal(view_tensor(cache, c), outs["C"])
    np.testing.assert_array_equal(view_tensor(cache, b, regions), outs["B"])
    assert msg.final
    assert msg.request_id == 7
    free_block(cache.get(msg.block.segment), msg.block)


def test_outputs_all_in_regions_take_no_arena_block(
    arena: ArenaAllocator, regions: ClientRegions, client_object: str
) -> None:
    region = OutputRegion(client_object, 1, 0, 16, "r")
    req = _request(("A",), (region,))
    msg = write_outputs(arena, regions, req, {"A": np.zeros(4, np.int32)}, final=False)
    assert msg.block is None
    assert not msg.final
    assert arena.live_blocks() == 0


def test_a_region_too_small_for_its_output_fails_before_any_copy(
    arena: ArenaAllocator, regions: ClientRegions, client_object: str
) -> None:
    region = OutputRegion(client_object, 1, 0, 8, "small")
    req = _request(("A", "B"), (None, region))
    outs = {"A": np.zeros(4, np.int32), "B": np.zeros(4, np.int32)}
    with pytest.raises(TritonMPError, match="should be at least 16 bytes") as e:
        write_outputs(arena, regions, req, outs)
    assert e.value.code == ErrorCode.INTERNAL
    assert arena.live_blocks() == 0


def test_a_region_past_the_object_end_leaves_no_arena_block(
    arena: ArenaAllocator, regions: ClientRegions, client_object: str
) -> None:
    region = OutputRegion(client_object, 1, 4064, 64, "moved")
    req = _request(("A", "B"), (None, region))
    outs = {
        "A": np.zeros(4, np.int32),
        "B": np.zeros(16, np.int32),
    }  # ends 32 bytes past the object's end
    with pytest.raises(TritonMPError, match="smaller than the registered window") as e:
        write_outputs(arena, regions, req, outs)
    assert e.value.code == ErrorCode.INVALID_ARG
    assert arena.live_blocks() == 0


def test_an_output_the_model_did_not_produce_is_left_out_as_in_triton(
    arena: ArenaAllocator, regions: ClientRegions
) -> None:
    resp = write_outputs(
        arena, regions, _request(("A", "B", "C")), {"C": np.ones(2), "A": np.zeros(1)}
    )
    assert resp.error is None
    # in the order the backend produced them (2.51: a python model's order), not the request's
    assert [o.name for o in resp.outputs] == ["C", "A"]
    nothing = write_outputs(arena, regions, _request(("B",)), {"A": np.zeros(1)})
    assert (nothing.error, nothing.outputs, nothing.block) == (None, (), None)


def test_a_block_nobody_will_read_is_freed_by_its_writer(arena: ArenaAllocator) -> None:
    block, _ = write_block(arena, [wire_tensor("A", np.ones(3, np.float64))])
    assert arena.live_blocks() == 1
    free_own_block(arena, block)
    assert arena.live_blocks() == 0


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(32, dtype=np.float32).reshape(2, 16),
        np.array(True),
        np.arange(6, dtype=np.float16).reshape(2, 3),
        np.arange(6, dtype=np.int64).reshape(2, 3).T,  # not contiguous: copied
        np.arange(4, dtype=">i4"),  # not native order: its bytes as they are
        np.zeros((0, 4), np.uint8),
        np.array([b"ab", b"c"], dtype=object),
    ],
    ids=["fp32", "bool-0d", "fp16", "transposed", "big-endian", "empty", "bytes"],
)
def test_a_wire_tensor_writes_exactly_the_wire_bytes(
    arena: ArenaAllocator, cache: SegmentCache, arr: np.ndarray
) -> None:
    """The array itself (fixed-size, C-contiguous) or its wire bytes: either way the block
    holds ``tensor_wire_bytes``'s bytes, and the ref their size and datatype."""
    datatype, data = tensor_wire_bytes(arr)
    block, (ref,) = write_block(arena, [wire_tensor("T", arr)])
    assert (ref.datatype, ref.shape, ref.nbytes) == (datatype, arr.shape, len(data))
    assert bytes(cache.get(ref.segment).buf[ref.offset : ref.offset + ref.nbytes]) == bytes(data)
    free_own_block(arena, block)


def test_request_inputs_view_arena_tensors_in_place_and_copy_an_overlapped_region_input(
    arena: ArenaAllocator, cache: SegmentCache, regions: ClientRegions, client_object: str
) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"ab", b""], dtype=np.object_)
    block, (ref_a, ref_s) = write_block(arena, [wire_tensor("A", a), wire_tensor("S", s)])
    obj = posix_ipc.SharedMemory(client_object)
    with open(obj.fd, "r+b", buffering=0) as f:
        f.write(np.array([7, 8], np.int32).tobytes())
    ref_r = TensorRef("R", "INT32", (2,), client_object, 0, 8, region_id=4)
    out = OutputRegion(client_object, 4, 0, 8, "r")  # NOTE: the window R's bytes lie in
    req = msgspec.structs.replace(_request(("O",), (out,)), inputs=(ref_a, ref_s, ref_r))
    inputs = request_inputs(cache, req, regions)
    assert list(inputs) == ["A", "S", "R"]
    np.testing.assert_array_equal(inputs["A"], a)
    assert inputs["A"].shape == (2, 3)
    assert inputs["A"].dtype == np.float32
    # NOTE: a view over the arena, not a copy: the block's bytes are the array's.
    assert np.shares_memory(inputs["A"], np.frombuffer(cache.get(ref_a.segment).buf, np.uint8))
    assert inputs["S"].tolist() == [b"ab", b""]
    np.testing.assert_array_equal(inputs["R"], [7, 8])
    region_view = view_tensor(cache, ref_r, regions)
    assert not np.shares_memory(inputs["R"], region_view)  # NOTE: overlapped: a copy
    del region_view
    free_block(cache.get(block.segment), block)


def test_request_inputs_refuse_a_window_past_the_segment_end(
    arena: ArenaAllocator, cache: SegmentCache
) -> None:
    seg, block = arena.alloc(64)
    ref = TensorRef("A", "FP32", (16,), seg.name, seg.size_bytes - 8, 64)
    req = msgspec.structs.replace(_request(()), inputs=(ref,))
    with pytest.raises(TypeError, match="too small"):
        request_inputs(cache, req, ClientRegions())
    free_block(seg, block_ref(seg, block))


def test_a_request_without_regions_gets_one_block_and_none_without_outputs(
    arena: ArenaAllocator, cache: SegmentCache, regions: ClientRegions
) -> None:
    outs = {"B": np.array([b"q"], dtype=np.object_), "A": np.arange(3, dtype=np.int16)}
    msg = write_outputs(arena, regions, _request(("A", "B")), outs)
    assert [r.name for r in msg.outputs] == ["B", "A"], "the backend's order"
    assert msg.block is not None
    assert all(r.segment == msg.block.segment and r.region_id == 0 for r in msg.outputs)
    assert view_tensor(cache, msg.outputs[0]).tolist() == [b"q"]
    np.testing.assert_array_equal(view_tensor(cache, msg.outputs[1]), outs["A"])
    free_block(cache.get(msg.block.segment), msg.block)
    empty = write_outputs(arena, regions, _request(()), outs)
    assert (empty.block, empty.outputs) == (None, ())
    assert arena.live_blocks() == 0


def _counting_size_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the size checks of client objects (``os.fstat`` when mapping, ``os.lseek`` to
    the end after)."""
    calls: list[int] = []
    real_fstat, real_lseek = os.fstat, os.lseek

    def fstat(fd: int) -> os.stat_result:
        calls.append(fd)
        return real_fstat(fd)

    def lseek(fd: int, pos: int, how: int) -> int:
        calls.append(fd)
        return real_lseek(fd, pos, how)

    monkeypatch.setattr(os, "fstat", fstat)
    monkeypatch.setattr(os, "lseek", lseek)
    return calls


def test_a_batch_checks_each_client_object_once_and_the_next_batch_again(
    regions: ClientRegions, client_object: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a batch an object's size is checked on its first use only (its mapping's
    fstat counts); after ``batch_ends`` a truncation is refused on the next use."""
    regions.window(client_object, 1, False, 0, 64, "input 'A'")  # mapped outside a batch
    calls = _counting_size_checks(monkeypatch)
    regions.window(client_object, 1, False, 0, 64, "input 'A'")
    regions.window(client_object, 1, False, 0, 64, "input 'A'")
    assert len(calls) == 2  # outside a batch: every use checks

    calls.clear()
    regions.batch_begins()
    for _ in range(5):
        regions.window(client_object, 1, False, 128, 64, "input 'A'")
        regions.window(client_object, 1, True, 256, 64, "output 'B'")  # a mapping of its own
    # NOTE: one check of the read-only mapping; the writable one is mapped in the batch and
    # its mapping's own fstat gives its size: ten uses, two checks.
    assert len(calls) == 2
    with pytest.raises(TritonMPError, match="smaller than the registered window"):
        regions.window(client_object, 1, False, 4064, 64, "input 'A'")  # the checked size
    regions.batch_ends()

    obj = posix_ipc.SharedMemory(client_object)
    os.ftruncate(obj.fd, 128)  # the client shrinks its object between two batches
    obj.close_fd()
    regions.batch_begins()
    with pytest.raises(TritonMPError, match="is 128 bytes now") as e:
        regions.window(client_object, 1, False, 128, 64, "input 'A'")
    assert e.value.code == ErrorCode.INVALID_ARG
    regions.batch_ends()


def test_a_fixed_size_input_in_a_client_region_is_a_view_of_it(
    cache: SegmentCache, regions: ClientRegions, client_object: str
) -> None:
    obj = posix_ipc.SharedMemory(client_object)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    os.pwrite(obj.fd, data.tobytes(), 64)
    ref = TensorRef("A", "FP32", (2, 4), client_object, 64, 32, region_id=1)
    got = view_tensor(cache, ref, regions)
    assert got.dtype == np.float32
    assert got.shape == (2, 4)
    assert got.flags.writeable  # NOTE: the model's to write (the next test)
    np.testing.assert_array_equal(got, data)
    os.pwrite(obj.fd, np.float32(-1).tobytes(), 64)
    obj.close_fd()
    assert got[0, 0] == -1  # a view of the client's memory, not a copy
    past = TensorRef("A", "FP32", (2, 4), client_object, 4080, 32, region_id=1)
    with pytest.raises(TritonMPError, match="smaller than the registered window"):
        view_tensor(cache, past, regions)


@pytest.mark.parametrize("pagemap", [True, False], ids=["pagemap", "no-pagemap"])
def test_a_model_writing_its_region_input_keeps_the_write_until_the_next_batch_reads(
    cache: SegmentCache, client_object: str, pagemap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton 2.51 gives a python model its own copy of a shared-memory input: a write in
    place neither fails nor reaches the client's object. Here the page written is a private
    copy until the window is viewed again, which gives it back first: that batch reads the
    client's bytes (and sees the client's later writes again). Without pagemap every window
    is given back."""
    if not pagemap:
        monkeypatch.setattr(tensor_io, "PrivatePages", lambda: PrivatePages(None))
    regions = ClientRegions()
    obj = posix_ipc.SharedMemory(client_object)
    try:
        os.pwrite(obj.fd, np.arange(4, dtype=np.float32).tobytes(), 64)
        ref = TensorRef("A", "FP32", (4,), client_object, 64, 16, region_id=1)
        regions.batch_begins()
        x = view_tensor(cache, ref, regions)
        x += 1
        assert x.tolist() == [1, 2, 3, 4]
        assert np.frombuffer(os.pread(obj.fd, 16, 64), np.float32).tolist() == [0, 1, 2, 3]
        regions.batch_ends()
        assert x.tolist() == [1, 2, 3, 4]  # the model's page until an input is read again

        os.pwrite(obj.fd, np.float32(9).tobytes(), 64)
        regions.batch_begins()
        y = view_tensor(cache, ref, regions)
        assert y.tolist() == [9, 1, 2, 3]
        assert x[0] == 9  # the page given back: shared with the client's object again
        regions.batch_ends()
        os.pwrite(obj.fd, np.float32(5).tobytes(), 64)
        assert y[0] == 5
        del x, y
    finally:
        obj.close_fd()
        regions.close()


def test_a_write_through_an_input_kept_past_its_batch_is_given_back(
    cache: SegmentCache, regions: ClientRegions, client_object: str
) -> None:
    """A model keeping its input's array and writing it while a later batch reads another
    mapping (here one registration of the object against another): the batch after that,
    reading the first again, sees the client's bytes, as each request's own copy in 2.51."""
    obj = posix_ipc.SharedMemory(client_object)
    os.pwrite(obj.fd, np.arange(4, dtype=np.float32).tobytes(), 0)
    obj.close_fd()
    first = TensorRef("A", "FP32", (4,), client_object, 0, 16, region_id=1)
    other = TensorRef("A", "FP32", (4,), client_object, 0, 16, region_id=2)
    regions.batch_begins()
    kept = view_tensor(cache, first, regions)
    regions.batch_ends()
    regions.batch_begins()
    view_tensor(cache, other, regions)
    kept[...] = -1
    regions.batch_ends()
    regions.batch_begins()
    assert view_tensor(cache, first, regions).tolist() == [0, 1, 2, 3]
    regions.batch_ends()
    del kept


def test_pagemap_tells_a_written_page_from_one_only_read(client_object: str) -> None:
    """``drop_written`` gives nothing back for pages only read, the written page once one
    is written (the client's byte shows again), then nothing again."""
    obj = posix_ipc.SharedMemory(client_object)
    pages = PrivatePages()
    buf, address = map_private(obj.fd, 4096)
    obj.close_fd()
    try:
        assert buf[100] == 0  # read: the page cache's page, mapped
        assert not pages.drop_written(buf, address, 0, 4096)
        buf[100] = 7
        assert pages.drop_written(buf, address, 96, 8)
        assert buf[100] == 0
        assert not pages.drop_written(buf, address, 0, 4096)
    finally:
        buf.close()
        pages.close()


def test_pagemap_is_opened_on_the_first_question_and_closed_with_its_owner() -> None:
    """``PrivatePages`` holds no descriptor until asked, and one dropped without ``close``
    closes it when collected: the unit suite makes a ClientRegions per call, and one open
    pagemap each had run the process past select()'s 1024 descriptors (test_notify)."""

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    pages = PrivatePages()
    assert fds() == before
    buf, address = map_private(-1, 4096)  # anonymous: its pages are the process's own
    try:
        buf[0] = 1
        assert pages.drop_written(buf, address, 0, 4096)
        assert buf[0] == 0  # NOTE: an anonymous page given back reads as zeros
        assert fds() == before + 1
        del pages
        gc.collect()
        assert fds() == before
    finally:
        buf.close()


def test_a_window_is_looked_at_again_only_after_a_page_fault(
    cache: SegmentCache, regions: ClientRegions, client_object: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A written page is a copy-on-write fault: with the fault count unchanged since the
    window was last given back, its next view looks at nothing (a write here without a
    fault counted is left alone to show it); once the count moves it is given back."""
    faults = [0]
    monkeypatch.setattr(tensor_io, "minor_faults", lambda: faults[0])
    ref = TensorRef("A", "FP32", (4,), client_object, 0, 16, region_id=1)
    regions.batch_begins()
    x = view_tensor(cache, ref, regions)
    regions.batch_ends()
    x[0] = 3
    regions.batch_begins()
    assert view_tensor(cache, ref, regions).tolist() == [3, 0, 0, 0]  # not looked at
    regions.batch_ends()
    faults[0] += 1
    regions.batch_begins()
    assert view_tensor(cache, ref, regions).tolist() == [0, 0, 0, 0]
    regions.batch_ends()
    del x


def test_two_inputs_of_a_batch_on_one_window_are_not_each_others(
    cache: SegmentCache, regions: ClientRegions, client_object: str
) -> None:
    """Two requests of one batch reading one window (perf_analyzer's requests all name the
    same region): Triton gives each model request its own copy, so a write through one is
    not seen through the other. The later overlapping view is a copy; a window apart is
    not, nor is one viewed again in the next batch."""
    obj = posix_ipc.SharedMemory(client_object)
    os.pwrite(obj.fd, np.arange(8, dtype=np.float32).tobytes(), 0)
    obj.close_fd()
    first = TensorRef("A", "FP32", (4,), client_object, 0, 16, region_id=1)
    overlapping = TensorRef("A", "FP32", (2,), client_object, 8, 8, region_id=1)
    apart = TensorRef("A", "FP32", (4,), client_object, 16, 16, region_id=1)
    regions.batch_begins()
    a = view_tensor(cache, first, regions)
    b = view_tensor(cache, overlapping, regions)
    c = view_tensor(cache, apart, regions)
    a += 10
    assert b.tolist() == [2, 3]
    assert b.flags.owndata
    assert not c.flags.owndata
    regions.batch_ends()
    regions.batch_begins()
    assert not view_tensor(cache, overlapping, regions).flags.owndata
    regions.batch_ends()
    del a, c


def test_for_a_backend_that_never_writes_its_inputs_one_window_is_viewed_not_copied(
    cache: SegmentCache, client_object: str
) -> None:
    """``copy_overlaps=False`` (``Backend.writes_inputs`` False: onnxruntime): every request
    of a batch reading one window gets a view of the one mapping, the bytes the client
    wrote; the default still copies the later overlapping view."""
    obj = posix_ipc.SharedMemory(client_object)
    os.pwrite(obj.fd, np.arange(8, dtype=np.float32).tobytes(), 0)
    obj.close_fd()
    ref = TensorRef("x", "FP32", (8,), client_object, 0, 32, region_id=1)
    views = ClientRegions(copy_overlaps=False)
    copies = ClientRegions()
    try:
        for regions, copied in ((views, False), (copies, True)):
            regions.batch_begins()
            arrays = [view_tensor(cache, ref, regions) for _ in range(3)]
            assert [a.tolist() for a in arrays] == [list(range(8))] * 3
            assert not arrays[0].flags.owndata
            assert [a.flags.owndata for a in arrays[1:]] == [copied, copied]
            assert np.shares_memory(arrays[0], arrays[2]) is not copied
            regions.batch_ends()
            del arrays
    finally:
        views.close()
        copies.close()
