"""setup.py names, as each extension's ``depends``, every project header its sources include,
directly or through another header: build_ext rebuilds an extension only when a source or a
dependency is newer than the built module, so a change to a header alone left a stale build
behind (session 13: a header-only change to the ring push, then workers/native/ring_push.h,
did not rebuild the answer writer). No compiler runs here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup_py(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """setup.py imported (its ``setup()`` call runs only as __main__), from the repository
    root as pip runs it."""
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("triton_mp_setup_py", ROOT / "setup.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_project_header_is_a_dependency_of_the_extensions_that_include_it(
    setup_py: ModuleType,
) -> None:
    extensions = {e.name: set(e.depends) for e in setup_py._extensions()}
    every = set().union(*extensions.values())
    headers = {str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.h")}
    assert headers - every == set()
    assert {
        "src/triton_mp/ipc/native/ring_push.h",
        "src/triton_mp/ipc/native/py_ref.h",
    } <= extensions["triton_mp.workers._answer_writer"]
    # NOTE: through frontend/native/ring_layout.h, a header of a header
    assert "src/triton_mp/ipc/native/ring_push.h" in extensions["triton_mp.frontend.native._native"]
    assert "src/triton_mp/ipc/records.h" in extensions["triton_mp.ipc._request_decoder"]
    assert (
        "src/triton_mp/ipc/native/ring_push.h" not in extensions["triton_mp.ipc._request_decoder"]
    )


def test_a_header_included_through_another_header_counts_once(
    setup_py: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.cc").write_text('#include "b.h"\n#include <vector>\n#include "gone.pb.h"\n')
    (tmp_path / "b.h").write_text('#pragma once\n#include "sub/c.h"\n')
    (tmp_path / "sub" / "c.h").write_text('#pragma once\n#include "../b.h"\n')
    got = setup_py._local_headers([str(tmp_path / "a.cc")])
    assert len(got) == 2
    assert {(ROOT / g).resolve() for g in got} == {tmp_path / "b.h", tmp_path / "sub" / "c.h"}
