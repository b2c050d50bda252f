"""A worker's answers to model readiness checks (``ReadyCheck``): the python model's
``is_ready()`` run off the worker's loop.

As upstream's ``RunUserModelReadinessCheck`` (python_be.cc): one call per instance at a
time; checks that arrive while one runs wait for it and get its answer. The call runs on a
thread of its own, so a slow ``is_ready()`` never holds up batches or cancellations (the
frontend gives up after ``READY_TIMEOUT_S`` and reports not ready, as upstream after its
five seconds). The check reaches a worker through its inbox, which the loop reads between
batches and the model's ``is_cancelled()`` during one (``workers.execution_watch``); so that
a check is answered during a long ``execute`` too, a worker whose model has ``is_ready()``
also polls the watch every ``POLL_S`` (``poll_periodically``; workers of other models do
not pay for it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from triton_mp.ipc.protocol.ready_messages import InstanceReadiness, ReadyCheck

log = logging.getLogger(__name__)

POLL_S = 0.05
"""Seconds between two looks at the inbox while a batch executes, in a worker whose model
has ``is_ready()`` (the delay a readiness check may wait for a running ``execute``)."""


def poll_periodically(poll: Callable[[], None], period_s: float = POLL_S) -> threading.Thread:
    """Call ``poll`` (``ExecutionWatch.poll``: a no-op between batches) every ``period_s``
    from a daemon thread, for the worker's life."""

    def loop() -> None:
        while True:
            time.sleep(period_s)
            try:
                poll()
            except Exception:  # noqa: BLE001 - keep polling; the loop reports its own errors
                log.exception("polling the inbox during a batch failed")

    thread = threading.Thread(target=loop, name="ready-poll", daemon=True)
    thread.start()
    return thread


class ReadinessRunner:
    """Runs the model's check for each ``ReadyCheck`` and answers it.

    Args:
        instance_id: this instance (``InstanceReadiness.instance_id``).
        check: ``check() -> (ready, why not)`` (``PythonBackend.check_ready``).
        reply: ``reply(check, answer)`` sends an answer to whoever asked ``check``
            (``Worker.reply_ready``).
        model, version: the model served, for the log line of a check that says not ready.

    A not-ready answer (False, not a bool, raising) is logged at ``--log-verbose
    1`` only, in core's words (server.cc ``ModelIsReady``: "Model 'm' version 1 is not ready:
    <why>"): Triton logs nothing about it at the default verbosity, neither does the python
    backend (python_be.cc returns the error to the core, which logs it verbosely).
    """

    def __init__(
        self,
        instance_id: int,
        check: Callable[[], tuple[bool, str]],
        reply: Callable[[ReadyCheck, InstanceReadiness], None],
        model: str = "",
        version: int = 0,
    ) -> None:
        self._instance_id = instance_id
        self._model = model
        self._version = version
        self._check = check
        self._reply = reply
        self._lock = threading.Lock()
        self._waiting: list[ReadyCheck] = []
        self._busy = False

    def ask(self, msg: ReadyCheck) -> None:
        """Answer ``msg`` after the running call, or after a new one when none runs."""
        with self._lock:
            self._waiting.append(msg)
            if self._busy:
                return
            self._busy = True
        threading.Thread(target=self._run, name="is-ready", daemon=True).start()

    def _run(self) -> None:
        ready, why = self._check()
        if not ready:
            log.debug("Model '%s' version %d is not ready: %s", self._model, self._version, why)
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._busy = False
        for msg in waiting:
            answer = InstanceReadiness(
                query_id=msg.query_id, instance_id=self._instance_id, ready=ready, message=why
            )
            try:
                self._reply(msg, answer)
            except Exception:  # noqa: BLE001 - a gone frontend must not stop the others
                log.exception("could not answer readiness check %d", msg.query_id)
