"""The HTTP server's request-parser limits and how it logs a request its parser refused.

Imported by ``frontend.http.routes`` (its ``AppRunner``); aiohttp's own defaults differ from
libevhtp's, 2.51's HTTP server, in what a client notices.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)


MAX_HEADER_FIELDS = 2**31 - 1
"""How many header fields a request may have: libevhtp (2.51's HTTP server) counts none, where
aiohttp refuses a 129th by default ("Too many headers received"). A field's line is capped at
8190 bytes by both (larger: 2.51 closes the connection, aiohttp answers 400)."""


class _MalformedRequestFilter(logging.Filter):
    """Turns aiohttp's ERROR and traceback for a request its parser refused (``LineTooLong``,
    ``BadStatusLine``, ...: ``HttpProcessingError``, answered 400 by aiohttp) into one DEBUG
    line, shown with ``--log-verbose 1``: a client's malformed bytes are no server error, and
    2.51 logs nothing for them."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        if not log.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = "malformed HTTP request from %s: %s", (*record.args, exc)  # type: ignore[misc]
        record.exc_info = record.exc_text = None
        return True


SERVER_LOG = logging.getLogger("aiohttp.server")
"""aiohttp's logger of request handling errors (its default), with ``_MalformedRequestFilter``."""
SERVER_LOG.addFilter(_MalformedRequestFilter())
