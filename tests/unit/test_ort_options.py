"""Unit tests for backends.onnxruntime.options: a config's JSON form -> onnxruntime settings.

Pure: no session is created (``build`` is checked on a SessionOptions only).
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort
import pytest

from triton_mp.backends.onnxruntime.options import build, session_settings
from triton_mp.common.errors import ConfigError

CPU_ONLY = ("CPUExecutionProvider",)
ALL = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "OpenVINOExecutionProvider") + CPU_ONLY


def _params(**kv: str) -> dict[str, Any]:
    return {"parameters": {k: {"string_value": v} for k, v in kv.items()}}


def _settings(
    config: dict[str, Any], kind: str = "KIND_CPU", cores: tuple[int, ...] = (), available=CPU_ONLY
):  # type: ignore[no-untyped-def]
    return session_settings(config, "m", kind, cores, available, default_threads=5)


@pytest.mark.parametrize(
    ("level", "name"),
    [
        (None, "ORT_ENABLE_ALL"),
        (-1, "ORT_ENABLE_BASIC"),
        (0, "ORT_ENABLE_ALL"),
        (1, "ORT_ENABLE_EXTENDED"),
        (2, "ORT_DISABLE_ALL"),
        (7, "ORT_ENABLE_ALL"),
    ],
)
def test_graph_levels_follow_tritons_backend(level: int | None, name: str) -> None:
    config = {} if level is None else {"optimization": {"graph": {"level": level}}}
    assert _settings(config).graph_level == name


def test_thread_counts_follow_the_parameters_then_the_pinned_cores() -> None:
    assert _settings({}).intra_op_threads == 5
    assert _settings({}, cores=(0, 1, 2)).intra_op_threads == 3
    s = _settings(_params(intra_op_thread_count="2", inter_op_thread_count="4"), cores=(0, 1, 2))
    assert (s.intra_op_threads, s.inter_op_threads) == (2, 4)
    assert _settings(_params(intra_op_thread_count="0")).intra_op_threads == 0


def test_execution_mode_and_memory_parameters() -> None:
    s = _settings(
        _params(
            execution_mode="1",
            enable_mem_arena="false",
            enable_mem_pattern="0",
            **{"memory.enable_memory_arena_shrinkage": "cpu:0", "session.x": "y"},
        )
    )
    assert s.parallel
    assert s.mem_arena is False
    assert s.mem_pattern is False
    assert s.run_entries == {"memory.enable_memory_arena_shrinkage": "cpu:0"}
    assert s.session_entries["session.x"] == "y"
    assert s.session_entries["session.intra_op.allow_spinning"] == "0"
    opts, run = build(s)
    assert opts.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert opts.enable_cpu_mem_arena is False
    assert opts.enable_mem_pattern is False
    assert opts.get_session_config_entry("session.x") == "y"
    assert run.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"


def test_bad_parameter_values_are_refused_with_tritons_messages() -> None:
    with pytest.raises(ConfigError) as info:
        _settings(_params(execution_mode="2"))
    assert info.value.message == (
        "Invalid configuration value provided. Expected values for  execution_mode are 0 or "
        "1 but got 2 ."
    )
    with pytest.raises(ConfigError, match="to integral number"):
        _settings(_params(intra_op_thread_count="many"))
    with pytest.raises(ConfigError, match="to boolean"):
        _settings(_params(enable_mem_arena="maybe"))


def _accel(group: str, name: str) -> dict[str, Any]:
    return {"optimization": {"execution_accelerators": {group: [{"name": name}]}}}


@pytest.mark.parametrize(
    ("group", "name", "provider"),
    [
        ("cpu_execution_accelerator", "openvino", "OpenVINOExecutionProvider"),
        ("gpu_execution_accelerator", "tensorrt", "TensorrtExecutionProvider"),
        ("gpu_execution_accelerator", "cuda", "CUDAExecutionProvider"),
    ],
)
def test_an_accelerator_this_host_lacks_is_refused(group: str, name: str, provider: str) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(_accel(group, name), kind="KIND_GPU")
    assert f"'{name}' execution accelerator" in info.value.message
    assert f"no {provider}" in info.value.message


def test_an_unknown_accelerator_gets_tritons_message() -> None:
    with pytest.raises(ConfigError) as info:
        _settings(_accel("cpu_execution_accelerator", "magic"))
    assert info.value.message == "unknown Execution Accelerator 'magic' is requested"


def test_available_accelerators_become_providers_in_order() -> None:
    s = _settings(_accel("cpu_execution_accelerator", "openvino"), available=ALL)
    assert s.providers == ("OpenVINOExecutionProvider", "CPUExecutionProvider")
    gpu = _settings(_accel("gpu_execution_accelerator", "tensorrt"), kind="KIND_GPU", available=ALL)
    assert gpu.providers == (
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    )


def test_gpu_accelerators_on_a_cpu_instance_warn_as_triton_ignores_them() -> None:
    s = _settings(_accel("gpu_execution_accelerator", "cuda"), kind="KIND_CPU", available=ALL)
    assert s.providers == ("CPUExecutionProvider",)
    assert len(s.warnings) == 1
    assert "KIND_GPU instances only" in s.warnings[0]


def test_custom_op_libraries_are_listed() -> None:
    s = _settings({"model_operations": {"op_library_filename": ["/x/libops.so"]}})
    assert s.op_libraries == ("/x/libops.so",)


def test_a_failed_run_is_worded_as_tritons_onnxruntime_backend() -> None:
    from triton_mp.backends.onnxruntime.backend import ort_run_error  # noqa: PLC0415
    from triton_mp.common.errors import ErrorCode, TritonMPError  # noqa: PLC0415

    err = ort_run_error(RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : boom\nmore"))
    assert isinstance(err, TritonMPError)
    assert (err.code, err.message) == (ErrorCode.INTERNAL, "onnx runtime error 6: boom\nmore")
    other = ValueError("Required inputs (['A']) are missing from input feed (['B']).")
    assert ort_run_error(other) is other
