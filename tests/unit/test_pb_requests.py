"""The python backend's C request builder (``backends/python/native/pb_requests.cc``) against
its Python twin, ``PythonBackend._pb_requests``' loop (``_native_requests`` set to None): on
random batches every slot of every ``pb_utils.InferenceRequest`` and of its input
``pb_utils.Tensor`` s holds the same object (or an equal new list); the C code builds exactly
the batches of untraced requests and declines the others (a traced request, another token,
inputs that are no dict or none at all), which the twin then builds, ``InferenceTrace``
included (a request without inputs to this batching model: the twin refuses the batch's
requests without inputs, ``request_rules.WithoutInputs``). A request an ensemble's step sent
gets its inputs' copies from both (``request_rules.own_step_inputs``). A model
then runs on what either built alike. In process, no shared memory.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triton_mp.backends.base import BackendRequest
from triton_mp.backends.python import backend as python_backend
from triton_mp.backends.python import pb_utils
from triton_mp.backends.python.backend import PythonBackend
from triton_mp.backends.python.request_rules import WithoutInputs
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    InferRequest,
    ReplyTo,
    Requester,
    TensorRef,
    TraceContext,
)
from triton_mp.ipc.protocol.specs import BatchingSpec, InstanceSpec, ModelVersionSpec, TensorSpec
from triton_mp.workers.warmup import WarmupToken

native = python_backend.native_requests
pytestmark = pytest.mark.skipif(
    native is None,
    reason="backends.python._pb_requests not built (python setup.py build_ext --inplace)",
)

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            tensors = [pb_utils.Tensor("OUT_" + t.name(), t.as_numpy() * 2) for t in r.inputs()]
            out.append(pb_utils.InferenceResponse(tensors))
        return out
"""
INSTANCE = InstanceSpec(instance_id=0, name="m_0", model="m", version=3)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PythonBackend]:
    root: Path = tmp_path_factory.mktemp("pb_requests")
    version = root / "m" / "3"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(MODEL))
    spec = ModelVersionSpec(
        model="m",
        version=3,
        backend="python",
        model_file=str(version / "model.py"),
        max_batch_size=8,
        batching=BatchingSpec(kind="dynamic", max_batch_size=8),
        inputs=(TensorSpec(name="A", datatype="FP32", dims=(-1,)),),
        outputs=(TensorSpec(name="OUT_A", datatype="FP32", dims=(-1,)),),
        instance_ids=(0,),
        config_json='{"name": "m", "max_batch_size": 8}',
    )
    b = PythonBackend(spec, INSTANCE)
    yield b
    b.close()


def _token(kind: str) -> object:
    if kind == "none":
        return None
    if kind == "warmup":
        return WarmupToken()
    return InferRequest(
        request_id=5,
        reply_to=ReplyTo(Requester.ENSEMBLE if kind == "step" else Requester.FRONTEND, 1),
        model="m",
        version=3,
        batch_size=1,
        inputs=(TensorRef("A", "FP32", (1, 2), "/s", 0, 8),),
        outputs=("OUT_A",),
        block=BlockRef("/s", 0),
        arrival_ns=1,
        trace=TraceContext(4) if kind == "traced" else None,
    )


@st.composite
def _request(draw: st.DrawFn) -> BackendRequest:
    names = draw(st.lists(st.sampled_from(("A", "B", "é", "")), max_size=3, unique=True))
    inputs: Any = {n: np.full((1, 2), i, np.float32) for i, n in enumerate(names)}
    if draw(st.integers(0, 19)) == 0:
        inputs = list(inputs.items())  # NOTE: not a dict: declined
    return BackendRequest(
        inputs,
        tuple(draw(st.lists(st.sampled_from(("OUT_A", "OUT_B")), max_size=2))),
        draw(st.integers(0, 8)),
        draw(st.sampled_from(("", "id-1", "ïd"))),
        draw(st.integers(0, 2**32 - 1)),
        draw(st.sampled_from(("{}", '{"k": 1}'))),
        draw(st.sampled_from((0, 7, 2**64 - 1, "corr"))),
        draw(st.integers(0, 3)),
        _token(draw(st.sampled_from(("none", "plain", "plain", "traced", "warmup", "step")))),
    )


def _takes(r: BackendRequest) -> bool:
    """Whether the C builder takes ``r`` (the module docstring), told independently."""
    token = r.token
    untraced = token is None or (type(token) is InferRequest and token.trace is None)
    return untraced and type(r.inputs) is dict and len(r.inputs) > 0


def _slots(pb: pb_utils.InferenceRequest) -> dict[str, Any]:
    return {name: getattr(pb, name) for name in pb_utils.InferenceRequest.__slots__}


def _from_step(r: BackendRequest) -> bool:
    return type(r.token) is InferRequest and r.token.reply_to.kind == Requester.ENSEMBLE


def _same(
    got: pb_utils.InferenceRequest, want: pb_utils.InferenceRequest, r: BackendRequest
) -> None:
    assert type(got) is type(want) is pb_utils.InferenceRequest
    g, w = _slots(got), _slots(want)
    for name in pb_utils.InferenceRequest.__slots__:
        if name == "_inputs":
            assert len(g[name]) == len(w[name])
            for a, b in zip(g[name], w[name], strict=True):
                assert type(a) is type(b) is pb_utils.Tensor
                assert a._name is b._name  # noqa: SLF001
                if _from_step(r):  # NOTE: copies, each its own
                    assert a._array is not b._array  # noqa: SLF001
                    assert a._array is not r.inputs[a._name]  # noqa: SLF001
                    assert a._array.dtype == r.inputs[a._name].dtype  # noqa: SLF001
                    assert np.array_equal(a._array, r.inputs[a._name])  # noqa: SLF001
                    assert a._array.flags.owndata  # noqa: SLF001
                else:
                    assert a._array is b._array  # noqa: SLF001
        elif name == "_requested_output_names":
            assert type(g[name]) is type(w[name]) is list
            assert g[name] == w[name]
        elif name == "_trace":
            assert _trace_slots(g[name]) == _trace_slots(w[name])
        else:
            assert g[name] is w[name], name


def _trace_slots(trace: object) -> object:
    if trace is None:
        return None
    return {s: getattr(trace, s) for s in type(trace).__slots__}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_request(), max_size=6))
def test_random_batches_are_built_as_the_python_loop_builds_them(
    backend: PythonBackend, reqs: list[BackendRequest]
) -> None:
    sender_for, cancelled = backend._sender_for, backend._request_cancelled  # noqa: SLF001
    direct = native.build(reqs, "m", 3, sender_for, cancelled)
    assert (direct is not None) == all(_takes(r) for r in reqs)
    if not all(type(r.inputs) is dict for r in reqs):
        return  # NOTE: the twin reads .items() of a dict; nothing to compare
    if not all(r.inputs for r in reqs):
        with pytest.raises(WithoutInputs) as e:
            backend._pb_requests(reqs, None)  # noqa: SLF001
        assert e.value.indices == [i for i, r in enumerate(reqs) if not r.inputs]
        return
    got = backend._pb_requests(reqs, None)  # noqa: SLF001
    saved = backend._native_requests  # noqa: SLF001
    backend._native_requests = None  # noqa: SLF001
    try:
        want = backend._pb_requests(reqs, None)  # noqa: SLF001
    finally:
        backend._native_requests = saved  # noqa: SLF001
    assert len(got) == len(want) == len(reqs)
    for g, w, r in zip(got, want, reqs, strict=True):
        _same(g, w, r)
    if direct is not None:
        for g, w, r in zip(direct, want, reqs, strict=True):
            _same(g, w, r)


def test_the_model_runs_alike_on_either(backend: PythonBackend) -> None:
    reqs = [
        BackendRequest({"A": np.arange(4, dtype=np.float32).reshape(1, 4) + i}, ("OUT_A",), 1)
        for i in range(3)
    ]
    got, _ = backend.execute(reqs)
    saved = backend._native_requests  # noqa: SLF001
    backend._native_requests = None  # noqa: SLF001
    try:
        want, _ = backend.execute(reqs)
    finally:
        backend._native_requests = saved  # noqa: SLF001
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, dict)
        assert isinstance(w, dict)
        assert g.keys() == w.keys() == {"OUT_A"}
        np.testing.assert_array_equal(g["OUT_A"], w["OUT_A"])
