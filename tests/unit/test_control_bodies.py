"""frontend/http/control_bodies.py and the other control-request rules read as Triton reads
them (server ``http_server.cc`` HandleRepositoryControl / HandleCudaSharedMemory,
``common.cc`` DecodeBase64 / ValidateSharedMemoryKey / GetModelVersionFromString)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.http.control_bodies import (
    as_object,
    cuda_register_body,
    libb64_decode,
    load_parameters,
    unload_body_dependents,
    unload_dependents,
)
from triton_mp.frontend.model_table import version_number
from triton_mp.frontend.shm.system import check_shm_key

HANDLE = bytes(range(64))
B64 = base64.b64encode(HANDLE).decode()
NO_MEMBER = "attempt to access non-existing object member"


def _error(fn: Any, *args: Any) -> tuple[ErrorCode, str]:
    with pytest.raises(TritonMPError) as e:
        fn(*args)
    return e.value.code, e.value.message


def test_base64_is_decoded_as_libb64_does() -> None:
    assert libb64_decode(B64) == HANDLE
    assert libb64_decode(B64[:40] + "\n !" + B64[40:]) == HANDLE  # other bytes skipped
    assert libb64_decode("YWJj") == b"abc"
    assert libb64_decode("YWI") == b"ab"  # no padding needed
    assert libb64_decode("!!!") == b""


def test_json_that_is_not_an_object_has_no_members() -> None:
    assert as_object([1]) == {}
    assert as_object(3) == {}
    assert as_object({"a": 1}) == {"a": 1}


def test_load_parameters_are_strings_config_and_files() -> None:
    body = {"parameters": {"config": "{}", "file:1/model.py": base64.b64encode(b"x").decode()}}
    assert load_parameters(body) == {"config": "{}", "file:1/model.py": b"x"}
    assert load_parameters({}) == {}
    assert _error(load_parameters, {"parameters": 3}) == (
        ErrorCode.INTERNAL,
        "attempt to get members for non-object",
    )
    assert _error(load_parameters, {"parameters": {"config": 3}}) == (
        ErrorCode.INTERNAL,
        "attempt to access JSON non-string as string",
    )
    assert _error(load_parameters, {"parameters": {"foo": "x"}}) == (
        ErrorCode.INTERNAL,
        "unexpected error on creating Triton parameter",
    )


def test_unload_dependents_other_than_a_boolean_unload_the_model_alone() -> None:
    assert unload_dependents({"parameters": {"unload_dependents": True}}) is True
    assert unload_dependents({"parameters": {"unload_dependents": "yes"}}) is False
    assert unload_dependents({"parameters": 3}) is False
    assert unload_dependents({}) is False


def test_an_unload_body_that_does_not_parse_unloads_the_model_alone() -> None:
    assert unload_body_dependents(b'{"parameters": {"unload_dependents": true}}') is True
    for raw in (b"", b"{", b"[1]", b"not json", b'{"parameters": {"unload_dependents": 1}}'):
        assert unload_body_dependents(raw) is False, raw


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({}, (ErrorCode.INVALID_ARG, "Shared memory register request has no 'raw_handle' field")),
        (
            {"raw_handle": "x", "byte_size": 4, "device_id": 0},
            (ErrorCode.INTERNAL, f"{NO_MEMBER} 'b64'"),
        ),
        (
            {"raw_handle": {"b64": 5}},
            (ErrorCode.INTERNAL, "attempt to access JSON non-string as string"),
        ),
        (
            {"raw_handle": {"b64": "!"}, "device_id": 0},
            (ErrorCode.INTERNAL, f"{NO_MEMBER} 'byte_size'"),
        ),
        (
            {"raw_handle": {"b64": "!"}, "byte_size": 4},
            (ErrorCode.INTERNAL, f"{NO_MEMBER} 'device_id'"),
        ),
        (
            {"raw_handle": {"b64": B64}, "byte_size": -1, "device_id": 0},
            (ErrorCode.INTERNAL, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ),
        (
            {"raw_handle": {"b64": "AAAA"}, "byte_size": 4, "device_id": 0},
            (
                ErrorCode.INVALID_ARG,
                "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
            ),
        ),
    ],
)
def test_a_cuda_register_body_is_read_in_tritons_member_order(
    body: dict[str, Any], error: tuple[ErrorCode, str]
) -> None:
    assert _error(cuda_register_body, body, 64) == error


def test_a_good_cuda_register_body() -> None:
    body = {"raw_handle": {"b64": B64}, "byte_size": 16, "device_id": 1}
    assert cuda_register_body(body, 64) == (HANDLE, 16, 1)


def test_shared_memory_keys_triton_refuses() -> None:
    check_shm_key("r", "/mine")
    with pytest.raises(InvalidRequest) as e:
        check_shm_key("r", "//")
    assert e.value.message == "cannot register shared memory region 'r' - invalid shm key '//'"
    with pytest.raises(InvalidRequest) as e:
        check_shm_key("r", "/triton_python_backend_shm_region_7")
    assert e.value.message == (
        "cannot register shared memory region 'r' with key '/triton_python_backend_shm_region_7'"
        " as the key contains the reserved prefix 'triton_python_backend_shm_region_'"
    )


def test_a_version_string_is_read_with_stol() -> None:
    assert [version_number(v) for v in ("1", " 2", "3x", "+4", "0")] == [1, 2, 3, 4, 0]
    for text in ("abc", "", "99999999999999999999", "x1"):
        with pytest.raises(InvalidRequest) as e:
            version_number(text)
        assert e.value.message == (
            f"failed to get model version from specified version string '{text}' (details: "
            "stol), version should be an integral value > 0"
        )
    with pytest.raises(InvalidRequest) as e:
        version_number("-1")
    assert e.value.message == (
        "invalid model version specified '-1' , version should be an integral value > 0"
    )
