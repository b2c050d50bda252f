"""``pb_utils.ModelConfig``: the config a python model's ``auto_complete_config`` edits, with
upstream's rules for each setter (no processes, no server)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from triton_mp.backends.python import pb_utils


def _empty() -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig({"name": "m", "max_batch_size": 0, "input": [], "output": []})


def test_model_config_completes_an_empty_config() -> None:
    mc = _empty()
    mc.set_max_batch_size(4)
    mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3], "optional": True})
    mc.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": (np.int64(2),)})
    mc.set_dynamic_batching()
    mc.set_model_transaction_policy({"decoupled": False})
    d = mc.as_dict()
    assert mc.max_batch_size() == 4
    assert d["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [3], "optional": True}]
    assert d["output"] == [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]}]
    assert d["dynamic_batching"] == {}
    assert d["model_transaction_policy"] == {"decoupled": False}
    json.dumps(d)  # plain JSON types only


def test_model_config_accepts_a_json_string() -> None:
    mc = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 2}))
    assert mc.max_batch_size() == 2


def test_set_max_batch_size_rules() -> None:
    mc = pb_utils.ModelConfig({"name": "m", "max_batch_size": 8})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        mc.set_max_batch_size(4)
    mc.set_max_batch_size(16)
    assert mc.max_batch_size() == 8, "a config may ask for less than the model allows"
    with pytest.raises(ValueError, match="non-negative"):
        _empty().set_max_batch_size(-1)
    with pytest.raises(ValueError, match="must be an int"):
        _empty().set_max_batch_size("4")  # type: ignore[arg-type]


def test_set_dynamic_batching_conflicts_with_sequence_batching() -> None:
    mc = pb_utils.ModelConfig({"name": "m", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sequence_batching"):
        mc.set_dynamic_batching()
    kept = pb_utils.ModelConfig(
        {"name": "m", "dynamic_batching": {"max_queue_delay_microseconds": 5}}
    )
    kept.set_dynamic_batching()
    assert kept.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}


def test_add_input_checks_keys_and_conflicts() -> None:
    mc = pb_utils.ModelConfig(
        {
            "name": "m",
            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [3]}],
            "output": [{"name": "OUT", "data_type": "TYPE_INVALID", "dims": []}],
        }
    )
    with pytest.raises(ValueError, match="unexpected properties"):
        mc.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": "x"})
    with pytest.raises(ValueError, match="missing property 'dims'"):
        mc.add_input({"name": "X", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="data_type"):
        mc.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [3]})
    with pytest.raises(ValueError, match="dims"):
        mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    with pytest.raises(ValueError, match="unexpected properties"):
        mc.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})  # same: no change
    mc.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [5]})  # fills the blanks
    d = mc.as_dict()
    assert len(d["input"]) == 1
    assert d["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [5]}]


def test_set_model_transaction_policy_conflict() -> None:
    mc = pb_utils.ModelConfig({"name": "m", "model_transaction_policy": {"decoupled": True}})
    with pytest.raises(ValueError, match="decoupled"):
        mc.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="unexpected properties"):
        mc.set_model_transaction_policy({"decoupled": True, "other": 1})
    mc.set_model_transaction_policy({"decoupled": True})
