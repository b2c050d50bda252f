"""The server's log settings as a frontend serves them (Triton's ``logging`` extension:
HTTP ``GET/POST /v2/logging``, gRPC ``LogSettings``).

Imported by ``frontend.api`` (built by ``frontend.main``) and called by both transports. An
update is checked by ``frontend.validation.log_settings``, applied to this process
(``common.process.log.apply_log_settings``) and sent, whole, as an
``ipc.protocol.log_messages.LogSettingsUpdate`` to the other frontends, to the supervisor and to the
scheduler, which applies it and passes it on to every worker: every process then logs by the
new settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from triton_mp.common.errors import TritonMPError
from triton_mp.common.process.log import LogSettings, apply_log_settings, current_log_settings
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate
from triton_mp.ipc.recordio.codec import encode

log = logging.getLogger(__name__)


class LogControl:
    """Reads and changes the log settings of the whole server from one frontend."""

    def __init__(
        self,
        frontend_id: int = 0,
        send_scheduler: Callable[[bytes], None] | None = None,
        send_peers: Callable[[bytes], None] | None = None,
        send_supervisor: Callable[[bytes], None] | None = None,
    ) -> None:
        self._frontend_id = frontend_id
        self._sends = [s for s in (send_peers, send_scheduler, send_supervisor) if s is not None]

    def settings(self) -> LogSettings:
        """The settings in force (``GET``, or a request with no settings)."""
        return current_log_settings()

    def update(self, new: LogSettings, error: TritonMPError | None = None) -> LogSettings:
        """Put ``new`` in force everywhere (when it differs), then raise ``error``: Triton
        applies the settings read before a bad one, and fails the request.

        Raises:
            TritonMPError: ``error``, when given.
        """
        if new != current_log_settings():
            apply_log_settings(new)
            log.info(
                "log settings: info %s, warning %s, error %s, verbose %d, format %s",
                new.info,
                new.warning,
                new.error,
                new.verbose,
                new.format,
            )
            msg = encode(
                LogSettingsUpdate(
                    frontend_id=self._frontend_id,
                    info=new.info,
                    warning=new.warning,
                    error=new.error,
                    verbose=new.verbose,
                    format=new.format,
                )
            )
            for send in self._sends:
                send(msg)
        if error is not None:
            raise error
        return new
