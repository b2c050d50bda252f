"""A version a later change stopped serving (version policy), as the frontend answers for
it: UNAVAILABLE "... is not at ready state" (core ``model_lifecycle.cc`` GetModel), and
strict readiness unaffected (Triton skips versions whose reason is "unloaded")."""

from __future__ import annotations

import pytest

from triton_mp.common.errors import ModelNotFound, ModelUnavailable
from triton_mp.frontend.model_table import ModelTable
from triton_mp.ipc.specs import ModelEntry


def _table() -> ModelTable:
    entry = ModelEntry(name="m", config=b"", ready_versions=(2,), retired_versions=(1,))
    return ModelTable((entry,))


def test_a_retired_version_is_not_at_ready_state() -> None:
    with pytest.raises(ModelUnavailable) as e:
        _table().resolve("m", "1")
    assert e.value.message == "Request for unknown model: 'm' version 1 is not at ready state"


def test_an_unknown_version_stays_not_found_and_latest_is_served() -> None:
    table = _table()
    with pytest.raises(ModelNotFound):
        table.resolve("m", "3")
    assert table.resolve("m", "")[1] == 2
    assert table.resolve("m", "2")[1] == 2


def test_a_retired_version_does_not_make_the_server_unready() -> None:
    assert _table().all_ready()
