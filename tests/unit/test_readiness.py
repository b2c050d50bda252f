"""Readiness checks that ask the model (python ``is_ready()``): the frontend's verdict, the
worker's one-call-at-a-time runner, the scheduler's choice of instances (no processes)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from triton_mp.frontend.readiness import ReadinessChecks, verdict
from triton_mp.ipc.protocol.messages import ToScheduler
from triton_mp.ipc.protocol.ready_messages import (
    InstanceReadiness,
    ReadyCheck,
    ReadyFanout,
    ReadyQuery,
)
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.workers.readiness import ReadinessRunner


def _answer(iid: int, ready: bool, why: str = "") -> InstanceReadiness:
    return InstanceReadiness(query_id=1, instance_id=iid, ready=ready, message=why)


def test_a_version_is_ready_when_every_instance_is() -> None:
    assert verdict([]) == (True, "")
    assert verdict([_answer(1, True), _answer(2, True)]) == (True, "")
    assert verdict([_answer(1, True), _answer(2, False, "down")]) == (False, "down")


def test_answers_may_come_before_the_fanout_and_a_silent_instance_times_out() -> None:
    sent: list[bytes] = []

    async def scenario() -> tuple[bool, bool, bool]:
        checks = ReadinessChecks(0, sent.append, timeout_s=0.2)
        first = asyncio.ensure_future(checks.ask("m", 1))
        await asyncio.sleep(0)
        checks.deliver(InstanceReadiness(query_id=1, instance_id=5, ready=True))
        checks.deliver(ReadyFanout(query_id=1, instance_ids=(5,)))
        nobody = asyncio.ensure_future(checks.ask("m", 1))
        await asyncio.sleep(0)
        checks.deliver(ReadyFanout(query_id=2, instance_ids=()))
        silent = asyncio.ensure_future(checks.ask("m", 1))
        await asyncio.sleep(0)
        checks.deliver(ReadyFanout(query_id=3, instance_ids=(5, 6)))
        checks.deliver(InstanceReadiness(query_id=3, instance_id=5, ready=True))
        return await first, await nobody, await silent

    assert asyncio.run(scenario()) == (True, True, False)
    query = Decoder(ToScheduler).decode(sent[0])
    assert query == ReadyQuery(query_id=1, frontend_id=0, model="m", version=1)


def test_checks_that_arrive_during_a_call_share_its_answer() -> None:
    release = threading.Event()
    calls: list[int] = []
    answers: list[tuple[int, InstanceReadiness]] = []
    done = threading.Event()

    def check() -> tuple[bool, str]:
        calls.append(1)
        release.wait(5)
        return False, "warming up"

    def reply(check: ReadyCheck, msg: InstanceReadiness) -> None:
        answers.append((check.frontend_id, msg))
        if len(answers) == 2:
            done.set()

    runner = ReadinessRunner(7, check, reply)
    runner.ask(ReadyCheck(query_id=1, frontend_id=0))
    runner.ask(ReadyCheck(query_id=2, frontend_id=1))
    release.set()
    assert done.wait(5)
    assert len(calls) == 1
    assert [(f, a.query_id, a.ready, a.message) for f, a in answers] == [
        (0, 1, False, "warming up"),
        (1, 2, False, "warming up"),
    ]


def test_a_not_ready_answer_is_logged_in_cores_words_at_debug_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """server.cc ModelIsReady's LOG_VERBOSE(1) line: debug (``--log-verbose 1``), never info."""
    done = threading.Event()
    runner = ReadinessRunner(
        3, lambda: (False, "RuntimeError: down"), lambda _f, _a: done.set(), "m", 2
    )
    with caplog.at_level(logging.DEBUG, logger="triton_mp.workers.readiness"):
        runner.ask(ReadyCheck(query_id=1, frontend_id=0))
        assert done.wait(5)
    records = [r for r in caplog.records if "is not ready" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.DEBUG, "Model 'm' version 2 is not ready: RuntimeError: down")
    ]
