"""The python backend's C result reader (``backends/python/native/pb_results.cc``) against its
Python twin, ``PythonBackend._returned_results``' loops (``_native_results`` set to None): on
random batches of returned responses (plain ones, errors, parameters, a tensor subclass, a
requested output missing or repeated, ``None``, no response, a response sender, release flags)
the same results (each dict with the same names in the same order holding the same arrays,
the same errors), and the C code reads exactly the batches of plain entries, declining the
others. In process, no shared memory.
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
from triton_mp.ipc.protocol.specs import BatchingSpec, InstanceSpec, ModelVersionSpec, TensorSpec

native = python_backend.native_results
pytestmark = pytest.mark.skipif(
    native is None,
    reason="backends.python._pb_results not built (python setup.py build_ext --inplace)",
)

ARRAYS = {name: np.full((1, 2), i, np.float32) for i, name in enumerate(("A", "B", "é"))}
RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


class _SubTensor(pb_utils.Tensor):
    """A tensor subclass a model may return (the twin's ResponseReader reads it)."""


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PythonBackend]:
    root: Path = tmp_path_factory.mktemp("pb_results")
    version = root / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(
        textwrap.dedent("""
        class TritonPythonModel:
            def execute(self, requests):
                return [None] * len(requests)
        """)
    )
    spec = ModelVersionSpec(
        model="m",
        version=1,
        backend="python",
        model_file=str(version / "model.py"),
        max_batch_size=8,
        batching=BatchingSpec(kind="dynamic", max_batch_size=8),
        inputs=(TensorSpec(name="IN", datatype="FP32", dims=(-1,)),),
        outputs=tuple(TensorSpec(name=n, datatype="FP32", dims=(-1,)) for n in ARRAYS),
        instance_ids=(0,),
        config_json='{"name": "m", "max_batch_size": 8}',
    )
    b = PythonBackend(spec, InstanceSpec(instance_id=0, name="m_0", model="m", version=1))
    assert b._native_results is not None  # noqa: SLF001
    yield b
    b.close()


_ENTRY = st.fixed_dictionaries(
    {
        "outputs": st.lists(st.sampled_from(tuple(ARRAYS)), max_size=3),
        "tensors": st.lists(st.sampled_from(tuple(ARRAYS)), max_size=4),
        "kind": st.sampled_from(("plain",) * 8 + ("error", "params", "sub", "none", "str")),
        "flags": st.sampled_from((1, 1, 1, 1, 1, 1, RESCHEDULE, 2**70)),
        "sender": st.integers(0, 9).map(lambda v: v == 0),
    }
)


def _build(entries: list[dict[str, Any]]) -> tuple[list[Any], list[Any], list[Any]]:
    """Fresh requests, pb requests and responses of ``entries`` (the arrays are shared)."""
    requests, pbs, responses = [], [], []
    for e in entries:
        r = BackendRequest({}, tuple(e["outputs"]), 1)
        pb = pb_utils._backend_request("m", list(e["outputs"]), [], "", 0, 1, 0, 0, "{}", r)  # noqa: SLF001
        pb.set_release_flags(e["flags"])
        if e["sender"]:
            pb._sender = pb_utils.InferenceResponseSender(  # noqa: SLF001
                lambda response, final: None, lambda: False, decoupled=False
            )
        tensor = _SubTensor if e["kind"] == "sub" else pb_utils.Tensor
        tensors = [tensor(n, ARRAYS[n]) for n in e["tensors"]]
        resp: Any = pb_utils.InferenceResponse(tensors)
        if e["kind"] == "error":
            resp = pb_utils.InferenceResponse(tensors, error=pb_utils.TritonError("no"))
        elif e["kind"] == "params":
            resp = pb_utils.InferenceResponse(tensors, parameters={"p": 1})
        elif e["kind"] == "none":
            resp = None
        elif e["kind"] == "str":
            resp = "not a response"
        requests.append(r)
        pbs.append(pb)
        responses.append(resp)
    return requests, pbs, responses


def _takes(e: dict[str, Any]) -> bool:
    """Whether the C reader takes the entry (the module docstring), told independently."""
    plain = e["kind"] == "plain" or (e["kind"] == "sub" and not e["tensors"])
    return plain and e["flags"] not in (RESCHEDULE, 2**70) and not e["sender"]


def _same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w)
        if isinstance(w, dict):
            assert list(g) == list(w)
            assert all(g[k] is w[k] for k in w)
        else:
            assert g == w


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ENTRY, max_size=6))
def test_random_batches_are_read_as_the_python_loops_read_them(
    backend: PythonBackend, entries: list[dict[str, Any]]
) -> None:
    direct = native.results(*_build(entries))
    assert (direct is not None) == all(_takes(e) for e in entries)
    got = backend._returned_results(*_build(entries))  # noqa: SLF001
    saved = backend._native_results  # noqa: SLF001
    backend._native_results = None  # noqa: SLF001
    try:
        want = backend._returned_results(*_build(entries))  # noqa: SLF001
    finally:
        backend._native_results = saved  # noqa: SLF001
    _same(got, want)
    if direct is not None:
        _same(direct, want)


def test_a_response_sent_through_a_sender_during_execute_is_left_to_python(
    backend: PythonBackend,
) -> None:
    requests, pbs, responses = _build(
        [{"outputs": ["A"], "tensors": ["A"], "kind": "plain", "flags": 1, "sender": False}] * 2
    )
    captured = pb_utils.InferenceResponse([pb_utils.Tensor("A", ARRAYS["B"])])
    backend._captured = {id(requests[0]): captured}  # noqa: SLF001
    got = backend._returned_results(requests, pbs, responses)  # noqa: SLF001
    assert got[0]["A"] is ARRAYS["B"]  # type: ignore[index]
    assert got[1]["A"] is ARRAYS["A"]  # type: ignore[index]
    assert backend._captured == {}  # noqa: SLF001


def test_other_sequences_and_lengths_are_declined() -> None:
    requests, pbs, responses = _build(
        [{"outputs": ["A"], "tensors": ["A"], "kind": "plain", "flags": 1, "sender": False}]
    )
    assert native.results(requests, pbs, responses) is not None
    assert native.results(tuple(requests), pbs, responses) is None
    assert native.results(requests, pbs, responses + [None]) is None
    assert native.results([], [], []) == []
