"""A stop signal that arrives before the server serves: the start ends at once, by the signal.

Imported by ``supervisor.main``. Triton 2.51 installs its SIGINT/SIGTERM handler only once
its models have loaded (server ``main.cc``: ``TRITONSERVER_ServerNew`` loads them, then
``RegisterSignalHandler``, then ``StartEndpoints``), so a signal during the load ends the
process by the signal's default action: no port ever opens, the exit status is ``-signum``
to a parent (``128 + signum`` from a shell; Ctrl-C: 130) and the budget of
``--exit-timeout-secs`` plays no part. The supervisor does the same: until its models have
loaded, its handler raises ``StartInterrupted`` in the main thread (the only one that
starts children then), which leaves the start wherever it was; ``Supervisor.run`` then kills
every child by PID (``kill_children``), unlinks the server's shared memory and ends itself
by the same signal (``die_by``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from typing import NoReturn

from triton_mp.common.process.proc_tree import direct_children

log = logging.getLogger(__name__)


class StartInterrupted(BaseException):  # noqa: N818 - a signal, not an error
    """SIGINT or SIGTERM before serving, raised by the supervisor's handler.

    A ``BaseException``, as ``KeyboardInterrupt``: no ``except Exception`` of the start path
    may take it for a failed load.

    Attributes:
        signum: the signal's number (2: SIGINT, 15: SIGTERM).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def kill_children(exclude: set[int]) -> list[int]:
    """SIGKILL and reap every child process of this one but ``exclude`` (multiprocessing's
    resource tracker, stopped by its own call), tracked or not: a signal that interrupted a
    spawn can leave a child whose ``Process`` object never recorded it. Returns their PIDs."""
    killed = [pid for pid in direct_children(os.getpid()) if pid not in exclude]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in killed:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return killed


def resource_tracker_pid() -> int | None:
    """The PID of multiprocessing's resource tracker (None: not started)."""
    from multiprocessing import resource_tracker  # noqa: PLC0415 - only on this path

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return pid if isinstance(pid, int) else None


def die_by(signum: int) -> NoReturn:
    """End this process by ``signum``'s default action, as a process with no handler for it:
    its parent sees ``-signum`` (a shell: ``128 + signum``). The logs are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    # NOTE: raise_signal is C's raise(): sent to this thread, delivered before it returns.
    signal.raise_signal(signum)
    os._exit(128 + signum)  # NOTE: not reached unless the signal is blocked
