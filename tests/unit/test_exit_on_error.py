"""Which models count as failed at start for ``--exit-on-error`` (supervisor.main)."""

from __future__ import annotations

from triton_mp.ipc.protocol.control_messages import ModelEntry
from triton_mp.supervisor.main import failed_at_start


def test_failed_versions_and_whole_model_failures_count() -> None:
    entries = (
        ModelEntry(name="ok", config=b"x", ready_versions=(1,)),
        ModelEntry(name="half", config=b"x", ready_versions=(2,), failed_versions=(1,)),
        ModelEntry(name="bad_config", config=b"", ready_versions=(), reason="parse error"),
        ModelEntry(name="gone", config=b"", ready_versions=(), reason="unloaded", unloaded=True),
    )
    assert failed_at_start(entries) == ["half", "bad_config"]


def test_nothing_failed() -> None:
    assert failed_at_start((ModelEntry(name="ok", config=b"x", ready_versions=(1,)),)) == []
