"""The CUDA shared-memory region table (frontend.shm.cuda), process-free."""

from __future__ import annotations

import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.shm.cuda import INVALID_ARGS, CudaShmRegistry

H = bytes(64)


def _reg(gpus: tuple[int, ...] = (0,), enabled: bool = True) -> CudaShmRegistry:
    return CudaShmRegistry(
        gpus, enabled=enabled, taken=lambda n: n == "sys", disabled_message="off"
    )


def _code(call: object) -> tuple[ErrorCode, str]:
    with pytest.raises(TritonMPError) as e:
        call()  # type: ignore[operator]
    return e.value.code, e.value.message


def test_register_checks_handle_device_and_names() -> None:
    reg = _reg()
    reg.register("a", H, 0, 32)
    assert _code(lambda: reg.register("a", H, 0, 32))[0] == ErrorCode.ALREADY_EXISTS
    assert _code(lambda: reg.register("sys", H, 0, 32))[0] == ErrorCode.ALREADY_EXISTS
    assert _code(lambda: reg.register("b", H[:10], 0, 32)) == (ErrorCode.INVALID_ARG, INVALID_ARGS)
    assert _code(lambda: reg.register("b", H, 3, 32)) == (ErrorCode.INVALID_ARG, INVALID_ARGS)
    assert _code(lambda: _reg(gpus=()).register("b", H, 0, 32)) == (
        ErrorCode.INVALID_ARG,
        INVALID_ARGS,
    )
    assert _code(lambda: _reg(enabled=False).register("b", H, 0, 32)) == (
        ErrorCode.UNSUPPORTED,
        "off",
    )


def test_status_unregister_and_refusal() -> None:
    reg = _reg()
    reg.register("a", H, 0, 32)
    assert [r.name for r in reg.status("", lambda n: False)] == ["a"]
    assert _code(lambda: reg.status("zz", lambda n: False))[1] == (
        "Unable to find cuda shared memory region: 'zz'"
    )
    assert "registered as system shared memory" in _code(lambda: reg.status("s", lambda n: True))[1]
    assert _code(lambda: reg.refuse_in_request("a", "input 'X'"))[0] == ErrorCode.UNSUPPORTED
    reg.refuse_in_request("unknown", "input 'X'")  # not a CUDA region: no refusal
    assert reg.unregister("nope") == []
    assert reg.unregister("") == ["a"]
    assert reg.status("", lambda n: False) == []
