"""A version a later change stopped serving (version policy), as the frontend answers for
it: UNAVAILABLE "... is not at ready state" (core ``model_lifecycle.cc`` GetModel), and
strict readiness unaffected (Triton skips versions whose reason is "unloaded")."""

from __future__ import annotations

import pytest

from triton_mp.common.errors import ModelNotFound, ModelUnavailable
from triton_mp.frontend.model_table import ModelTable
from triton_mp.ipc.protocol.specs import ModelEntry


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


def test_an_unloaded_model_keeps_its_versions_unavailable() -> None:
    """After an unload Triton answers "has no available versions" for the latest and
    "is not at ready state" for a version the model served."""
    table = ModelTable(
        (
            ModelEntry(
                name="m",
                config=b"",
                ready_versions=(),
                reason="unloaded",
                unloaded=True,
                retired_versions=(1, 2),
            ),
        )
    )
    with pytest.raises(ModelNotFound) as e:
        table.resolve("m", "")
    assert e.value.message == "Request for unknown model: 'm' has no available versions"
    with pytest.raises(ModelUnavailable) as e2:
        table.resolve("m", "2")
    assert e2.value.message == "Request for unknown model: 'm' version 2 is not at ready state"
    with pytest.raises(ModelNotFound) as e3:
        table.resolve("m", "3")
    assert e3.value.message == "Request for unknown model: 'm' version 3 is not found"
    with pytest.raises(ModelNotFound) as e4:
        table.resolve("other", "")
    assert e4.value.message == "Request for unknown model: 'other' is not found"
    assert table.unloaded_versions("m") == (1, 2)


def test_an_unloaded_model_that_had_failed_keeps_the_server_unready() -> None:
    """core ``InferenceServer::IsReady``: only versions whose reason is "unloaded" are
    skipped, and a version that failed to load keeps its reason through the unload."""
    failed = ModelEntry(
        name="m",
        config=b"",
        ready_versions=(),
        reason="unloaded",
        unloaded=True,
        failed_versions=(1,),
        version_reasons={1: "boom"},
    )
    table = ModelTable((failed,))
    assert not table.all_ready()
    assert table.unloaded_failures("m") == {1: "boom"}
    table.update((ModelEntry(name="m", config=b"", ready_versions=(1,)),))
    assert table.all_ready()
    assert table.unloaded_failures("m") == {}


def test_a_version_draining_after_a_reload_is_unavailable_and_keeps_the_server_unready() -> None:
    """Retired by a change while its requests finish (Triton: UNLOADING): not at ready state,
    and strict readiness false (its reason is not "unloaded" yet), until it is retired."""
    table = ModelTable(
        (ModelEntry(name="m", config=b"", ready_versions=(2,), unloading_versions=(1,)),)
    )
    with pytest.raises(ModelUnavailable) as e:
        table.resolve("m", "1")
    assert e.value.message == "Request for unknown model: 'm' version 1 is not at ready state"
    assert table.resolve("m", "")[1] == 2
    assert not table.all_ready()
    table.update((ModelEntry(name="m", config=b"", ready_versions=(2,), retired_versions=(1,)),))
    assert table.all_ready()


def test_the_supervisor_lists_a_draining_version_as_unloading_then_retired() -> None:
    from triton_mp.frontend.admin.repository import _model_rows
    from triton_mp.supervisor.models.served_models import ServedModel

    model = ServedModel(name="m", retired={1}, unloading={1})
    entry = model.entry()
    assert (entry.unloading_versions, entry.retired_versions) == ((1,), ())
    table = ModelTable((entry,))
    rows = [(r.version, r.state, r.reason) for _, r in _model_rows(table.get("m"), False)]
    assert rows == [("1", "UNLOADING", "")]
    model.unloading.clear()
    entry = model.entry()
    assert (entry.unloading_versions, entry.retired_versions) == ((), (1,))
