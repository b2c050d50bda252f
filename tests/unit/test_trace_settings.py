"""Trace settings at run time (``frontend.tracing.settings``): Triton's TraceManager rules for
global and per-model settings, sampling by rate and count, and the trace files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.trace_config import TraceConfig
from triton_mp.frontend.tracing.settings import (
    NewSetting,
    TraceSettings,
    new_setting_from_grpc,
    new_setting_from_json,
)
from triton_mp.frontend.tracing.tracer import Tracer


def _settings(tmp_path: Path, **kw: object) -> TraceSettings:
    config = TraceConfig(level=4, rate=1, file=str(tmp_path / "t.json"), **kw)  # type: ignore[arg-type]
    return TraceSettings(config)


def test_the_view_is_tritons_json_shape(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert s.view("") == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(tmp_path / "t.json"),
        "trace_mode": "triton",
    }


def test_model_settings_fall_back_to_the_global_one_until_cleared(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    s.update("m", NewSetting(rate=5))
    assert s.view("m")["trace_rate"] == "5"
    s.update("", NewSetting(count=7))
    # the model mirrors the global count (it did not set one), keeps its own rate
    assert (s.view("m")["trace_rate"], s.view("m")["trace_count"]) == ("5", "7")
    s.update("m", NewSetting(clear_rate=True))
    assert s.view("m")["trace_rate"] == "1"
    assert "m" not in s.models  # nothing of its own left: the global setting serves it


def test_rate_samples_every_nth_and_count_stops(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    s.update("", NewSetting(rate=3, count=2))
    setting = s.global_setting
    hits = [setting.take_sample() for _ in range(12)]
    assert hits == [False, False, True, False, False, True] + [False] * 6
    assert s.view("")["trace_count"] == "0"


def test_invalid_updates_get_tritons_errors(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    with pytest.raises(TritonMPError, match="sample rate must be non-zero"):
        s.update("", NewSetting(rate=0))
    with pytest.raises(TritonMPError) as e:
        new_setting_from_json({"trace_file": "/x"})
    assert e.value.code == ErrorCode.UNSUPPORTED
    assert e.value.message == "trace file location can not be updated through network protocol"
    with pytest.raises(TritonMPError, match="Expect only one trace level 'OFF' is specified"):
        new_setting_from_json({"trace_level": ["OFF", "TIMESTAMPS"]})
    with pytest.raises(TritonMPError, match=r"Unable to parse 'trace_rate', got: abc"):
        new_setting_from_json({"trace_rate": "abc"})
    with pytest.raises(TritonMPError, match=r"out of range \[ 0, 4294967295 \]"):
        new_setting_from_json({"trace_rate": "99999999999"})
    with pytest.raises(TritonMPError, match="Expecting value >= -1, got:-5"):
        new_setting_from_json({"trace_count": "-5"})
    with pytest.raises(TritonMPError, match="non-string") as e:
        new_setting_from_json({"trace_rate": 5})
    assert e.value.code == ErrorCode.INTERNAL
    with pytest.raises(TritonMPError, match="expect only 1 value for 'trace_rate'"):
        new_setting_from_grpc({"trace_rate": ["1", "2"]})
    assert new_setting_from_json({"trace_rate": "-1"}).rate == 2**32 - 1
    assert new_setting_from_json({"trace_level": ["BOGUS"]}).level is None
    assert new_setting_from_grpc({"trace_level": []}).clear_level


def _finish(tracer: Tracer, model: str = "m") -> None:
    trace = tracer.sample(model)
    assert trace is not None
    trace.stamp("REQUEST_START", 1)
    trace.stamp("REQUEST_END", 2)
    tracer.finish(trace)


def test_log_frequency_writes_indexed_files_and_shutdown_the_rest(tmp_path: Path) -> None:
    tracer = Tracer(TraceConfig(level=4, rate=1, log_frequency=2, file=str(tmp_path / "t.json")))
    for _ in range(5):
        _finish(tracer)
    first = json.loads((tmp_path / "t.json.0").read_text())
    assert [o["id"] for o in first if "model_name" in o] == [1, 2]
    assert json.loads((tmp_path / "t.json.1").read_text())[0]["id"] == 3
    tracer.close()
    assert json.loads((tmp_path / "t.json.2").read_text())[0]["id"] == 5
    assert not (tmp_path / "t.json").exists()


def test_without_log_frequency_one_file_at_shutdown(tmp_path: Path) -> None:
    tracer = Tracer(TraceConfig(level=4, rate=2, file=str(tmp_path / "t.json")))
    for _ in range(3):
        trace = tracer.sample("m")
        if trace is not None:
            trace.stamp("REQUEST_START", 5)
            tracer.finish(trace)
    assert not (tmp_path / "t.json").exists()
    tracer.close()
    objects = json.loads((tmp_path / "t.json").read_text())
    assert objects == [
        {"id": 1, "model_name": "m", "model_version": -1},
        {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 5}]},
    ]


def test_count_reaching_zero_writes_an_indexed_file(tmp_path: Path) -> None:
    tracer = Tracer(TraceConfig(level=4, rate=1, count=2, file=str(tmp_path / "t.json")))
    _finish(tracer)
    _finish(tracer)
    assert tracer.sample("m") is None
    assert len(json.loads((tmp_path / "t.json.0").read_text())) == 6


def test_tracing_off_is_one_flag_until_a_setting_turns_it_on(tmp_path: Path) -> None:
    assert not Tracer(TraceConfig()).active
    with pytest.raises(TritonMPError, match="trace file name is not given"):
        Tracer(TraceConfig()).setting_request("", NewSetting(level=4), True)
    tracer = Tracer(TraceConfig(file=str(tmp_path / "t.json")))
    assert not tracer.active
    tracer.setting_request("m", NewSetting(level=4), True)
    assert tracer.active
    assert tracer.sample("other") is None
    assert tracer.sample("m") is None
    with pytest.raises(TritonMPError, match="Request for unknown model : x"):
        tracer.setting_request("x", None, False)


@pytest.mark.parametrize("indexed", [False, True])
def test_a_trace_file_that_cannot_be_written_logs_one_error_and_raises_nothing(
    tmp_path: Path, indexed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from triton_mp.frontend.tracing.settings import TraceFile

    trace_file = TraceFile(str(tmp_path / "missing-dir" / "t.json"))
    trace_file.save('{"id":1}', indexed=indexed)
    trace_file.close()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert errors[0].startswith("failed creating trace file: ")
    assert "missing-dir" in errors[0]
