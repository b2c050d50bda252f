"""A request the frontend refuses where Triton's backend would have (a BYTES element cut
off by the tensor's end): 2.51 counts it as the model's failure, reason BACKEND; the frontend
says so to the scheduler (``RequestRefused``). Every other BYTES refusal is core's and
counted nowhere, as in 2.51."""

from __future__ import annotations

import struct

import pytest

from tests.unit.scheduler_harness import Harness, model_spec
from triton_mp.common.errors import InvalidRequest
from triton_mp.frontend.validation.inputs import RefusedByBackend, check_bytes_elements
from triton_mp.ipc.protocol.messages import RequestRefused


def _element(n: int, data: bytes) -> bytes:
    return struct.pack("<I", n) + data


def test_only_a_cut_last_element_is_the_backends_refusal() -> None:
    with pytest.raises(RefusedByBackend):
        check_bytes_elements(_element(2, b"ab") + _element(100, b"xy"), 2, "IN", "m", "")
    for data, count in ((_element(0xFFFFFFFF, b"abc"), 2), (b"\x01\x00", 1)):
        with pytest.raises(InvalidRequest) as e:
            check_bytes_elements(data, count, "IN", "m", "")
        assert not isinstance(e.value, RefusedByBackend)


def test_the_scheduler_counts_a_refusal_as_a_backend_failure() -> None:
    h = Harness(models=(model_spec("m", (10,)),))
    h.handle(RequestRefused(model="m", version=1, request_ns=1500))
    st = h.stats("m")
    assert (st.fail.count, st.fail.ns, st.fail_reasons) == (1, 1500, {"BACKEND": 1})
    assert (st.success.count, st.execution_count) == (0, 0)
