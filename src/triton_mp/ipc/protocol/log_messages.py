"""What travels when a client changes the log settings (Triton's ``logging`` extension).

Imported by ``ipc.protocol.messages``, which puts ``LogSettingsUpdate`` in the ``ToScheduler``,
``ToWorker`` and ``ToFrontend`` unions. The frontend that took the request sends the
settings now in force to its peers and to the scheduler; the scheduler applies them and sends
them on to every worker (and to each worker that becomes ready later), so every role logs by
the same settings whichever frontend a client reached (``common.process.log.apply_log_settings``).
"""

from __future__ import annotations

import msgspec

from triton_mp.common.process.log import LogSettings, apply_log_settings


class LogSettingsUpdate(
    msgspec.Struct, frozen=True, kw_only=True, tag="log_settings", array_like=True
):
    """The server's log settings after an update (whole, not a delta): Triton's
    ``log_info``, ``log_warning``, ``log_error``, ``log_verbose_level`` and ``log_format``
    (``common.process.log.LogSettings``)."""

    frontend_id: int
    """The frontend that took the request (-1 when the scheduler resends it)."""
    info: bool
    warning: bool
    error: bool
    verbose: int
    """``log_verbose_level``: > 0 logs DEBUG (per-request detail)."""
    format: str
    """``default``, ``ISO8601`` (console text) or ``json``."""


def apply_update(msg: LogSettingsUpdate) -> None:
    """Log by the settings another process sent (frontend peers, scheduler, workers)."""
    apply_log_settings(
        LogSettings(
            info=msg.info,
            warning=msg.warning,
            error=msg.error,
            verbose=msg.verbose,
            format=msg.format,
        )
    )
