"""aiohttp imported without its client's CA bundle: ~33 ms of CPU off each frontend's start.

Imported by ``supervisor.processes.child_entry`` in a frontend process (a spare too), before
the frontend's modules, which import aiohttp at their top. ``aiohttp.connector`` builds two
client ``ssl.SSLContext``s when it is imported (``_SSL_CONTEXT_VERIFIED`` and
``_SSL_CONTEXT_UNVERIFIED``, aiohttp 3.10 on), and each loads the system's CA bundle
(``set_default_verify_paths``): 100 -> 67 ms of CPU for ``import aiohttp.web`` on this
project's machines (measured 2026-12-07, 5 runs each). A frontend serves HTTP (Triton's
endpoint has no TLS) and never connects with aiohttp's client, so the bundle is left unloaded
while aiohttp is imported, and only then: the two contexts exist without CA certificates (a
client connection verified through the first would be refused, never accepted unverified),
and every ``SSLContext`` made afterwards loads the bundle as usual.
"""

from __future__ import annotations

import ssl
import sys
import threading

_LOCK = threading.Lock()
_LOADERS = ("load_default_certs", "set_default_verify_paths")
"""``ssl.SSLContext``'s methods that load the CA bundle (the first calls the second on
Linux; aiohttp's unverified context calls the second itself)."""


def _skip_ca_bundle(self: ssl.SSLContext, *_args: object) -> None:
    """``SSLContext.load_default_certs`` / ``set_default_verify_paths`` while aiohttp is
    imported: nothing loaded."""


def import_aiohttp_without_client_tls() -> None:
    """Import ``aiohttp.web`` with ``ssl.SSLContext``'s two CA-bundle loaders switched off for
    the import's duration (then put back exactly as they were); nothing when aiohttp is
    imported already."""
    if "aiohttp" in sys.modules:
        return
    cls = ssl.SSLContext
    with _LOCK:
        own = {name: cls.__dict__[name] for name in _LOADERS if name in cls.__dict__}
        try:
            for name in _LOADERS:
                setattr(cls, name, _skip_ca_bundle)
            import aiohttp.web  # noqa: F401, PLC0415 - the import this module is for
        finally:
            for name in _LOADERS:
                if name in own:
                    setattr(cls, name, own[name])
                else:
                    delattr(cls, name)
