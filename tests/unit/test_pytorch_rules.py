"""The PyTorch backend's pure rules: Triton's naming conventions and its parameters."""

from __future__ import annotations

import logging

import pytest

from triton_mp.backends.pytorch.naming import Convention, input_map, output_map
from triton_mp.backends.pytorch.parameters import TorchParameters, parse_bool, parse_int
from triton_mp.common.errors import ConfigError, ErrorCode

SELF = ("self", "ClassType")


def _args(*names: str) -> list[tuple[str, str]]:
    return [SELF, *((n, "TensorType") for n in names)]


def test_forward_argument_names_win() -> None:
    m = input_map("m", ["y", "x"], _args("x", "y"))
    assert m.convention is Convention.FORWARD_ARGUMENT
    assert m.positions == {"y": 1, "x": 0}


def test_named_index_when_names_are_not_arguments() -> None:
    m = input_map("m", ["INPUT__1", "INPUT__0"], _args("a", "b"))
    assert m.convention is Convention.NAMED_INDEX
    assert m.positions == {"INPUT__1": 1, "INPUT__0": 0}


def test_strict_ordering_otherwise_with_tritons_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        m = input_map("m", ["IN__x", "other"], _args("a", "b"))
    assert m.convention is Convention.STRICT_CONFIG_ORDERING
    assert m.positions == {"IN__x": 0, "other": 1}
    assert "input 'IN__x' or previous input(s) are neither an input argument" in caplog.text
    # NOTE: a name without "__" falls back silently, as in Triton.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert input_map("m", ["p", "q"], _args("a", "b")).positions == {"p": 0, "q": 1}
    assert caplog.text == ""


def test_input_count_must_match_forward() -> None:
    with pytest.raises(ConfigError) as e:
        input_map("m", ["INPUT__0"], _args("a", "b"))
    assert e.value.message == (
        "unable to load model 'm', configuration expects 1 inputs, model provides 2"
    )
    assert e.value.code == ErrorCode.INVALID_ARG


def test_dict_input_and_bad_argument_types() -> None:
    m = input_map("m", ["a", "b"], [SELF, ("d", "DictType")])
    assert m.dict_input
    assert set(m.positions) == {"a", "b"}
    with pytest.raises(ConfigError, match="Only a single input of type Dict"):
        input_map("m", ["a"], [SELF, ("x", "TensorType"), ("d", "DictType")])
    with pytest.raises(ConfigError, match="An input of type 'IntType' was detected"):
        input_map("m", ["a"], [SELF, ("x", "IntType")])
    with pytest.raises(ConfigError, match="at least one input"):
        input_map("m", [], _args())


def test_outputs_named_index_or_config_order(caplog: pytest.LogCaptureFixture) -> None:
    assert output_map("m", ["OUTPUT__1", "OUTPUT__0"]).positions == {"OUTPUT__1": 1, "OUTPUT__0": 0}
    with caplog.at_level(logging.WARNING):
        strict = output_map("m", ["b", "OUT__z"])
    assert strict.convention is Convention.STRICT_CONFIG_ORDERING
    assert strict.positions == {"b": 0, "OUT__z": 1}
    with pytest.raises(ConfigError, match="at least one output"):
        output_map("m", [])


def test_states_need_named_index_everywhere() -> None:
    m = input_map("m", ["INPUT__0"], _args("a", "b"), state_inputs=["STATE__1"])
    assert m.positions == {"INPUT__0": 0, "STATE__1": 1}
    with pytest.raises(ConfigError) as e:
        input_map("m", ["x"], _args("x", "s"), state_inputs=["STATE__1"])
    assert e.value.message == (
        "PyTorch model 'm' is using sequence batching with state but not all inputs and "
        "outputs follow the <name>__<index> naming convention. "
    )
    with pytest.raises(ConfigError, match="but state 'state' does not follow"):
        output_map("m", ["OUTPUT__0"], state_outputs=["state"])


def test_controls_count_and_need_named_index() -> None:
    m = input_map("m", ["IN__0"], _args("a", "b", "c"), ["S__2"], control_inputs=["START__1"])
    assert m.positions == {"IN__0": 0, "START__1": 1, "S__2": 2}
    with pytest.raises(ConfigError) as e:
        input_map("m", ["IN__0"], _args("a", "b"), control_inputs=["START"])
    assert e.value.message == "input 'START' does not follow <name>__<index> naming convention."


def test_parameters_defaults_are_tritons() -> None:
    p = TorchParameters.from_config({})
    assert (p.optimized_execution, p.inference_mode, p.cudnn, p.cache_cleaning) == (
        True,
        True,
        True,
        False,
    )
    assert (p.tensor_fuser, p.jit_profiling, p.jit_executor) == (None, None, None)
    assert (p.intra_op_threads, p.inter_op_threads) == (0, 0)


def test_parameters_parse_as_triton() -> None:
    def sv(v: str) -> dict[str, str]:
        return {"string_value": v}

    p = TorchParameters.from_config(
        {
            "DISABLE_OPTIMIZED_EXECUTION": sv("TRUE"),
            "INFERENCE_MODE": sv("off"),
            "DISABLE_CUDNN": sv("1"),
            "ENABLE_CACHE_CLEANING": sv("on"),
            "ENABLE_TENSOR_FUSER": sv("false"),
            "INTRA_OP_THREAD_COUNT": sv(" 3 threads"),
            "INTER_OP_THREAD_COUNT": sv("-2"),
        }
    )
    assert not p.optimized_execution
    assert not p.inference_mode
    assert not p.cudnn
    assert p.cache_cleaning
    assert p.tensor_fuser is False
    assert (p.intra_op_threads, p.inter_op_threads) == (3, -2)


def test_bad_parameter_values_get_tritons_messages() -> None:
    with pytest.raises(ConfigError) as e:
        TorchParameters.from_config({"INFERENCE_MODE": {"string_value": "maybe"}})
    assert (e.value.message, e.value.code) == (
        "failed to convert 'maybe' to boolean",
        ErrorCode.INVALID_ARG,
    )
    with pytest.raises(ConfigError, match="failed to convert 'many' to integral number"):
        TorchParameters.from_config({"INTRA_OP_THREAD_COUNT": {"string_value": "many"}})
    assert parse_bool("Yes".replace("Yes", "ON"))
    assert parse_int("+7") == 7
