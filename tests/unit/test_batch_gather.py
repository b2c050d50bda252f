"""The C batch gather (``workers/native/batch_gather.cc``) against its Python twin, the loop of
``BatchRequests.backend_requests`` (``native=False``): on random batches, the same runnable
requests, errors and exceptions, each ``BackendRequest`` field for field, and each input the
array numpy's ``np.ndarray(shape, dtype, buffer, offset)`` makes (dtype object, shape,
strides, flags, base, data address, bytes). The C code must decline exactly the batches off
its path (a client output region, an input of BYTES, in a client region, in a segment that is
gone, past its buffer's end) and build every other one.

No process is started: an arena of this test process stands for a frontend's, named
``/triton_mp_<pid>_test_bg<n>`` and unlinked by the fixture.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triton_mp.backends.base import BackendRequest
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    OutputRegion,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.tensor_pool import ArenaAllocator, SegmentCache
from triton_mp.workers.tensors import batch_requests
from triton_mp.workers.tensors.batch_requests import BatchRequests
from triton_mp.workers.tensors.tensor_io import FIXED_DTYPES, ClientRegions

native = batch_requests.native_gather
pytestmark = pytest.mark.skipif(
    native is None, reason="workers._batch_gather not built (python setup.py build_ext --inplace)"
)

_names = itertools.count()
ORIGIN = "worker m_0"
SEGMENT_BYTES = 1 << 16
GONE = "/triton_mp_0_gone_segment"
DATATYPES = sorted(FIXED_DTYPES)


@pytest.fixture(scope="module")
def segment() -> Iterator[str]:
    """The name of one segment of an arena of this process (the requests' inputs lie in it)."""
    alloc = ArenaAllocator(
        f"/triton_mp_{os.getpid()}_test_bg{next(_names)}", SEGMENT_BYTES, SEGMENT_BYTES
    )
    seg, _ = alloc.alloc(64)
    yield seg.name
    alloc.close_and_unlink()


@pytest.fixture(scope="module")
def caches() -> Iterator[dict[bool, SegmentCache]]:
    """A read-only and a writable cache, closed once the module's arrays are gone (an array
    over an unmapped segment would crash whoever prints it)."""
    made = {False: SegmentCache(), True: SegmentCache(writable=True)}
    yield made
    for cache in made.values():
        cache.close()


@st.composite
def _input(draw: st.DrawFn, i: int, segment: str) -> TensorRef:
    datatype = draw(
        st.sampled_from([*DATATYPES, "BYTES"])
        if draw(st.booleans())
        else st.sampled_from(DATATYPES)
    )
    shape = tuple(draw(st.lists(st.integers(0, 6), max_size=4)))
    itemsize = FIXED_DTYPES[datatype].itemsize if datatype in FIXED_DTYPES else 1
    nbytes = itemsize * int(np.prod(shape, dtype=np.int64))
    # NOTE: mostly windows inside the segment, some that pass its end (numpy refuses them)
    offset = draw(
        st.one_of(
            st.integers(0, max(0, SEGMENT_BYTES - nbytes)),
            st.integers(SEGMENT_BYTES - nbytes, SEGMENT_BYTES + 8),
        )
    )
    region = draw(st.sampled_from((0, 0, 0, 0, 0, 0, 3)))
    seg = draw(st.sampled_from((segment,) * 9 + (GONE,)))
    name = draw(st.sampled_from((f"IN{i}", "IN0", "é", "")))
    return TensorRef(name, datatype, shape, seg, max(offset, 0), nbytes, region)


@st.composite
def _request(draw: st.DrawFn, rid: int, segment: str) -> InferRequest:
    n = draw(st.integers(0, 3))
    inputs = tuple(draw(_input(i, segment)) for i in range(n))
    outputs = tuple(draw(st.lists(st.sampled_from(("OUT", "O2")), max_size=2, unique=True)))
    regions: tuple[OutputRegion | None, ...] = ()
    if outputs and draw(st.integers(0, 9)) == 0:
        regions = (OutputRegion("/client", 3, 0, 64, "r"),) + (None,) * (len(outputs) - 1)
    return InferRequest(
        request_id=rid,
        reply_to=ReplyTo(Requester.FRONTEND, 2),
        model="m",
        version=1,
        batch_size=draw(st.integers(0, 4)),
        inputs=inputs,
        outputs=outputs,
        block=BlockRef(segment, 0),
        arrival_ns=5,
        timeout_us=draw(st.integers(0, 2**32 - 1)),
        client_id=draw(st.sampled_from(("", "id", "ïd"))),
        parameters_json=draw(st.sampled_from(("{}", '{"k": 1}'))),
        output_regions=regions,
        sequence_id=draw(st.sampled_from((0, 9, 2**64 - 1, "corr"))),
        sequence_flags=draw(st.integers(0, 3)),
    )


def _plain(req: InferRequest, segment: str) -> bool:
    """Whether the C gather takes ``req`` (the module docstring's path), told independently."""
    if req.output_regions:
        return False
    for ref in req.inputs:
        dtype = FIXED_DTYPES.get(ref.datatype)
        if dtype is None or ref.region_id or ref.segment != segment:
            return False
        if ref.offset + dtype.itemsize * int(np.prod(ref.shape, dtype=np.int64)) > SEGMENT_BYTES:
            return False
    return True


def _same_array(got: Any, want: Any) -> None:
    assert type(got) is type(want) is np.ndarray
    if want.dtype == np.object_:  # NOTE: BYTES: a new array (Python built both)
        assert got.shape == want.shape
        assert got.tolist() == want.tolist()
        return
    assert got.dtype is want.dtype
    assert got.shape == want.shape
    assert got.strides == want.strides
    flags = ("C_CONTIGUOUS", "F_CONTIGUOUS", "OWNDATA", "WRITEABLE", "ALIGNED", "WRITEBACKIFCOPY")
    assert [got.flags[f] for f in flags] == [want.flags[f] for f in flags]
    assert got.base is want.base
    assert got.__array_interface__["data"] == want.__array_interface__["data"]
    assert got.tobytes() == want.tobytes()


def _same_request(got: BackendRequest, want: BackendRequest) -> None:
    assert type(got) is type(want) is BackendRequest
    fields = [f for f in BackendRequest.__struct_fields__ if f not in ("inputs", "token")]
    assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields]
    assert got.token is want.token
    assert list(got.inputs) == list(want.inputs)  # NOTE: the same names in the same order
    for name in want.inputs:
        _same_array(got.inputs[name], want.inputs[name])


REGIONS = ClientRegions()
"""Shared by both sides: an input in a client region is the view of one mapping."""


def _gather(cache: SegmentCache, native_path: bool, reqs: tuple[InferRequest, ...]) -> Any:
    """``(runnable, backend requests, results)`` or the exception raised."""
    gather = BatchRequests(cache, REGIONS, None, ORIGIN, native=native_path)
    results: list[Any] = [None] * len(reqs)
    try:
        runnable, built = gather.backend_requests(reqs, results)
    except Exception as e:  # noqa: BLE001 - compared with the twin's
        return e
    return runnable, built, results


@pytest.mark.parametrize("writable", [False, True], ids=["read-only", "writable"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_batches_are_built_as_the_python_loop_builds_them(
    segment: str, caches: dict[bool, SegmentCache], writable: bool, data: st.DataObject
) -> None:
    n = data.draw(st.integers(1, 6))
    reqs = tuple(data.draw(_request(i + 1, segment)) for i in range(n))
    cache = caches[writable]
    direct = native.backend_requests(reqs, lambda s: cache.get(s).buf)
    assert (direct is not None) == all(_plain(r, segment) for r in reqs)
    got = _gather(cache, True, reqs)
    want = _gather(cache, False, reqs)
    if isinstance(want, Exception):
        assert type(got) is type(want)
        assert str(got) == str(want)
        return
    assert not isinstance(got, Exception)
    assert got[0] == want[0]
    assert got[2] == want[2]
    assert len(got[1]) == len(want[1])
    for g, w in zip(got[1], want[1], strict=True):
        _same_request(g, w)
    if direct is not None:
        for g, w in zip(direct, want[1], strict=True):
            _same_request(g, w)


@pytest.mark.parametrize(
    "change",
    [
        {"output_regions": (OutputRegion("/client", 3, 0, 64, "r"),)},
        {"datatype": "BYTES"},
        {"region_id": 3},
        {"segment": GONE},
        {"offset": SEGMENT_BYTES - 63},
        {"shape": (1, -1)},
        {"shape": [1, 16]},
        {"offset": -1},
    ],
    ids=[
        "output region",
        "BYTES",
        "client region",
        "gone",
        "past the end",
        "negative dim",
        "list shape",
        "negative offset",
    ],
)
def test_each_request_off_the_path_declines_the_whole_batch(
    segment: str, caches: dict[bool, SegmentCache], change: dict[str, object]
) -> None:
    ref = TensorRef("IN", "FP32", (1, 16), segment, 64, 64)
    req = InferRequest(
        request_id=1,
        reply_to=ReplyTo(Requester.FRONTEND, 2),
        model="m",
        version=1,
        batch_size=1,
        inputs=(ref,),
        outputs=("OUT",),
        block=BlockRef(segment, 0),
        arrival_ns=5,
    )
    cache = caches[False]
    buf_of = lambda s: cache.get(s).buf  # noqa: E731
    assert native.backend_requests((req, req), buf_of) is not None
    if "output_regions" in change:
        odd = msgspec.structs.replace(req, **change)  # type: ignore[arg-type]
    else:
        # NOTE: msgspec does not check types at construction: a list shape and a
        # negative offset reach the gather as they are.
        fields = {f: getattr(ref, f) for f in TensorRef.__struct_fields__} | change
        odd = msgspec.structs.replace(req, inputs=(ref, TensorRef(**fields)))  # type: ignore[arg-type]
    assert native.backend_requests((req, odd), buf_of) is None


def test_a_memoryview_buffer_keeps_its_object_as_base_as_numpy_does() -> None:
    backing = bytearray(256)
    backing[64:128] = np.arange(16, dtype=np.float32).tobytes()
    view = memoryview(backing)
    ref = TensorRef("IN", "FP32", (1, 16), "/seg", 64, 64)
    req = InferRequest(
        request_id=1,
        reply_to=ReplyTo(Requester.FRONTEND, 2),
        model="m",
        version=1,
        batch_size=1,
        inputs=(ref,),
        outputs=(),
        block=BlockRef("/seg", 0),
        arrival_ns=5,
    )
    got = native.backend_requests((req,), lambda s: view)
    assert got is not None
    want = np.ndarray((1, 16), FIXED_DTYPES["FP32"], view, 64)
    _same_array(got[0].inputs["IN"], want)
    assert got[0].inputs["IN"].base is backing
    assert got[0].inputs["IN"].flags.writeable


def test_buf_of_is_asked_once_per_segment_and_its_error_declines() -> None:
    asked: list[str] = []
    backing = bytearray(1024)

    def buf_of(segment: str) -> Any:
        asked.append(segment)
        if segment == "/bad":
            raise RuntimeError("gone")
        return backing

    def req(segment: str, rid: int) -> InferRequest:
        refs = tuple(TensorRef(f"I{i}", "INT8", (4,), segment, 8 * i, 4) for i in range(3))
        return InferRequest(
            request_id=rid,
            reply_to=ReplyTo(Requester.FRONTEND, 2),
            model="m",
            version=1,
            batch_size=1,
            inputs=refs,
            outputs=(),
            block=BlockRef(segment, 0),
            arrival_ns=5,
        )

    assert native.backend_requests(tuple(req("/a", i) for i in range(4)), buf_of) is not None
    assert asked == ["/a"]
    assert native.backend_requests((req("/a", 1), req("/bad", 2)), buf_of) is None
    assert native.backend_requests((), buf_of) == []
