"""Log settings requests (Triton's ``logging`` extension), process-free: the checks in
Triton's order and words (server ``HandleLogging`` / ``RegisterLogging``), the settings a
partly bad request leaves in force, and what the level switch lets through."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.errors import ErrorCode
from triton_mp.common.process import log as common_log
from triton_mp.common.process.log import LogSettings, apply_log_settings
from triton_mp.frontend.admin.logs import LogControl
from triton_mp.frontend.validation.log_settings import (
    settings_json,
    update_from_grpc,
    update_from_json,
)
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate
from triton_mp.ipc.protocol.messages import ToScheduler, ToWorker
from triton_mp.ipc.recordio.codec import Decoder

START = LogSettings()


@pytest.mark.parametrize(
    ("body", "code", "text"),
    [
        ({"log_file": "/tmp/x"}, ErrorCode.UNSUPPORTED, "log file location can not be updated"),
        ({"log_info": 1}, ErrorCode.INTERNAL, "attempt to access JSON non-boolean as boolean"),
        ({"log_error": "true"}, ErrorCode.INTERNAL, "non-boolean as boolean"),
        ({"log_verbose_level": -1}, ErrorCode.INTERNAL, "non-unsigned-integer as unsigned"),
        ({"log_verbose_level": True}, ErrorCode.INTERNAL, "non-unsigned-integer"),
        ({"log_verbose_level": 1.5}, ErrorCode.INTERNAL, "non-unsigned-integer"),
        ({"log_format": 3}, ErrorCode.INTERNAL, "attempt to access JSON non-string as string"),
        (
            {"log_format": "json"},
            ErrorCode.UNAVAILABLE,
            "invalid argument for --log_format, got: json",
        ),
    ],
)
def test_http_refusals_use_tritons_status_and_words(body, code, text) -> None:  # type: ignore[no-untyped-def]
    _, err = update_from_json(START, body)
    assert err is not None
    assert err.code is code
    assert text in err.message


def test_http_applies_the_settings_read_before_a_bad_one() -> None:
    after, err = update_from_json(START, {"log_warning": False, "log_verbose_level": "2"})
    assert err is not None
    assert not after.warning
    assert after.verbose == 0
    # log_file is read first: nothing applies
    after, err = update_from_json(START, {"log_info": False, "log_file": "f"})
    assert err is not None
    assert after == START


def test_http_nulls_and_unknown_names_change_nothing() -> None:
    assert update_from_json(START, {"log_info": None, "log_file": None, "x": 1}) == (START, None)
    after, err = update_from_json(START, {"log_verbose_level": 3, "log_format": "ISO8601"})
    assert err is None
    assert after.verbose == 3
    assert after.format == "ISO8601"
    assert list(settings_json(after)) == [
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    ]


def _grpc(**values: object) -> dict[str, pb.LogSettingsRequest.SettingValue]:
    req = pb.LogSettingsRequest()
    for k, v in values.items():
        field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(v)]
        setattr(req.settings[k], field, v)
    return dict(req.settings)


@pytest.mark.parametrize(
    ("values", "code", "text"),
    [
        ({"log_file": ""}, ErrorCode.UNSUPPORTED, "log file location can not be updated"),
        ({"log_info": 1}, ErrorCode.INVALID_ARG, "expect boolean for 'log_info'"),
        ({"log_warning": "x"}, ErrorCode.INVALID_ARG, "expect boolean for 'log_warning'"),
        (
            {"log_verbose_level": True},
            ErrorCode.INVALID_ARG,
            "expect int32 for 'log_verbose_level'",
        ),
        ({"log_format": 1}, ErrorCode.INVALID_ARG, "expect string for 'log_format'"),
        (
            {"log_format": "json"},
            ErrorCode.INVALID_ARG,
            "invalid argument for log_format, got: json",
        ),
    ],
)
def test_grpc_refusals_use_tritons_status_and_words(values, code, text) -> None:  # type: ignore[no-untyped-def]
    _, err = update_from_grpc(START, _grpc(**values))
    assert err is not None
    assert err.code is code
    assert err.message == text or text in err.message


def test_grpc_update_and_partial_update() -> None:
    after, err = update_from_grpc(START, _grpc(log_error=False, log_verbose_level=2))
    assert err is None
    assert not after.error
    assert after.verbose == 2
    after, err = update_from_grpc(START, _grpc(log_info=False, log_format="bad"))
    assert err is not None
    assert not after.info
    assert after.format == "default"


def test_the_update_travels_to_the_scheduler_and_its_workers() -> None:
    sent: list[bytes] = []
    control = LogControl(2, sent.append, sent.append)
    before = common_log.current_log_settings()
    try:
        new = LogSettings(info=False, verbose=1)
        assert control.update(new) == new
        assert len(sent) == 2  # peers, scheduler
        msg = Decoder(ToScheduler).decode(sent[1])
        assert isinstance(msg, LogSettingsUpdate)
        assert msg.verbose == 1
        assert not msg.info
        assert isinstance(Decoder(ToWorker).decode(sent[1]), LogSettingsUpdate)
        control.update(new)  # unchanged: nothing sent
        assert len(sent) == 2
    finally:
        apply_log_settings(before)


def test_level_switch_drops_the_levels_turned_off() -> None:
    switch = common_log._LevelSwitch()
    before = common_log.current_log_settings()

    def passes(level: int) -> bool:
        return switch.filter(logging.LogRecord("x", level, "", 0, "m", (), None))

    try:
        apply_log_settings(LogSettings(info=False, warning=True, error=False, verbose=1))
        assert logging.getLogger().level == logging.DEBUG
        assert [passes(x) for x in (10, 20, 30, 40, 50)] == [True, False, True, False, False]
        apply_log_settings(LogSettings())
        assert logging.getLogger().level == logging.INFO
        assert all(passes(x) for x in (20, 30, 40))
    finally:
        apply_log_settings(before)


def test_the_supervisor_logs_by_an_update_from_a_frontends_pipe() -> None:
    from multiprocessing import Pipe

    from triton_mp.ipc.recordio.codec import encode
    from triton_mp.supervisor.processes.frontend_link import FrontendLink

    before = common_log.current_log_settings()
    ours, theirs = Pipe()
    link = FrontendLink(lambda: False)
    calls: list[object] = []
    try:
        link.attach({0: ours}, lambda fid, call: calls.append(call))
        update = LogSettingsUpdate(
            frontend_id=0, info=False, warning=True, error=True, verbose=3, format="default"
        )
        theirs.send_bytes(encode(update))
        deadline = time.monotonic() + 5
        while common_log.current_log_settings().verbose != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert common_log.current_log_settings() == LogSettings(info=False, verbose=3)
        assert calls == []  # not a call: nothing to answer
    finally:
        link.close()
        theirs.close()
        apply_log_settings(before)


def test_a_respawned_childs_spec_carries_the_settings_in_force() -> None:
    from triton_mp.ipc.protocol.specs import (
        ChannelSpec,
        InboxSpec,
        LogSpec,
        SchedulerSpec,
        with_current_log,
    )
    from triton_mp.ipc.recordio.codec import encode

    before = common_log.current_log_settings()
    wakeup = Wakeup("semaphore", "/w")
    spec = SchedulerSpec(
        models=(),
        inbox=InboxSpec(wakeup, ("/r0",)),
        to_workers={},
        to_frontends={0: ChannelSpec("/r1", wakeup)},
        log=LogSpec(),
    )
    data = encode(spec)
    try:
        apply_log_settings(LogSettings())
        assert with_current_log("scheduler", data) == data  # unchanged: the same bytes
        apply_log_settings(LogSettings(warning=False, verbose=2))
        out = Decoder(SchedulerSpec).decode(with_current_log("scheduler", data))
        assert out.log == LogSpec(2, "console", True, False, True)
        assert out.to_frontends == spec.to_frontends
    finally:
        apply_log_settings(before)


def test_log_to_file_points_stderr_at_the_end_of_the_file(tmp_path: Path) -> None:
    target = tmp_path / "server.log"
    target.write_text("kept\n")
    saved = os.dup(2)
    try:
        assert common_log.log_to_file(str(target)) == ""
        os.write(2, b"to the file\n")
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    assert target.read_text() == "kept\nto the file\n"


def test_log_to_file_that_cannot_open_leaves_stderr_and_says_why(tmp_path: Path) -> None:
    before = os.fstat(2)
    assert common_log.log_to_file(str(tmp_path / "no" / "dir.log")) == "No such file or directory"
    after = os.fstat(2)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)


def test_the_log_file_flag_is_acted_on_and_reported() -> None:
    from triton_mp.cli.flag_table import FLAGS
    from triton_mp.cli.flags import parse
    from triton_mp.ipc.protocol.specs import LogSpec, current_log_spec

    parsed = parse(["--log-file", "/var/log/t.log"], FLAGS)
    assert parsed.values["log_file"] == "/var/log/t.log"
    assert not [w for w in parsed.warnings if "log-file" in w]
    common_log.configure_logging("frontend", "0", file="/var/log/t.log")
    try:
        assert common_log.current_log_settings().file == "/var/log/t.log"
        assert current_log_spec() == LogSpec(file="/var/log/t.log")
    finally:
        common_log.configure_logging("frontend", "0")
