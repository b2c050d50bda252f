"""Loading the native extension (``frontend.native._load``): a build whose ABI is not the
sources' (built before a change of what Python passes it) is treated as absent, with the
reason, so the Python server serves instead of failing calls."""

from __future__ import annotations

import importlib
import types

import pytest

from triton_mp.frontend import native


def _fake(monkeypatch: pytest.MonkeyPatch, **attrs: object) -> None:
    module = types.ModuleType("triton_mp.frontend.native._native")
    for name, value in attrs.items():
        setattr(module, name, value)
    monkeypatch.setattr(importlib, "import_module", lambda name: module)
    monkeypatch.delenv("TRITON_MP_NATIVE", raising=False)


def test_a_stale_build_is_unavailable_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch)  # NOTE: builds before ABI 2 have no ABI constant
    module, why = native._load()
    assert module is None
    assert "rebuild" in why
    assert "ABI 1" in why


def test_a_current_build_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, ABI=native._ABI)
    module, why = native._load()
    assert module is not None
    assert why == ""


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_the_built_extension_is_current() -> None:
    assert native._NATIVE.ABI == native._ABI  # type: ignore[union-attr]
