"""``frontend.http.aiohttp_import``: aiohttp's client contexts made without the CA bundle,
``ssl`` exactly as it was afterwards, and the frontend's modules importable after it. One
fresh interpreter (~0.5 s), no server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import triton_mp

SRC = str(Path(triton_mp.__file__).resolve().parents[1])

CODE = """
import ssl, sys
loaders = ("load_default_certs", "set_default_verify_paths")
before = {n: ssl.SSLContext.__dict__.get(n) for n in loaders}
cas = ssl.create_default_context().cert_store_stats()["x509_ca"]
from triton_mp.supervisor.processes import child_entry  # noqa: F401 - what a child runs first
assert "aiohttp" not in sys.modules
from triton_mp.frontend.http.aiohttp_import import import_aiohttp_without_client_tls
import_aiohttp_without_client_tls()
import triton_mp.frontend.main  # noqa: F401
import aiohttp.connector as c
assert {n: ssl.SSLContext.__dict__.get(n) for n in loaders} == before
assert ssl.create_default_context().cert_store_stats()["x509_ca"] == cas
print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"], cas)
"""


def test_aiohttp_is_imported_without_loading_the_ca_bundle_and_ssl_is_restored() -> None:
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    in_aiohttp, system = out.stdout.split()
    assert in_aiohttp == "0", f"aiohttp's client context loaded {in_aiohttp} CA certificates"
    assert int(system) >= 0


def test_a_frontend_process_imports_aiohttp_that_way() -> None:
    """``child_entry`` calls it before it imports the frontend's modules."""
    text = (Path(SRC) / "triton_mp/supervisor/processes/child_entry.py").read_text()
    call = text.index("import_aiohttp_without_client_tls()")
    assert call < text.index("from triton_mp.frontend.main import run_frontend")
