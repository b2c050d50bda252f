"""RepositoryIndex lists the repository's directories only (core
``ModelRepositoryManager::RepositoryIndex`` walks them): a model loaded from ``file:``
overrides alone serves but is left out, as 2.51 does."""

from __future__ import annotations

from pathlib import Path

from triton_mp.frontend.admin.repository import IndexEntry, RepositoryApi
from triton_mp.frontend.model_table import ModelTable
from triton_mp.ipc.protocol.specs import ModelEntry


def _api(repository: str) -> RepositoryApi:
    served = tuple(
        ModelEntry(name=n, config=b"", ready_versions=(1,)) for n in ("on_disk", "made_up")
    )
    return RepositoryApi(models=ModelTable(served), repository=repository)


def test_only_the_repositorys_directories_are_listed(tmp_path: Path) -> None:
    for name in ("on_disk", "never_loaded"):
        (tmp_path / name).mkdir()
    api = _api(str(tmp_path))
    assert api.index(ready_only=False) == [
        IndexEntry("never_loaded"),
        IndexEntry("on_disk", "1", "READY"),
    ]
    assert api.index(ready_only=True) == [IndexEntry("on_disk", "1", "READY")]


def test_without_a_repository_every_served_model_is_listed() -> None:
    names = [e.name for e in _api("").index(ready_only=False)]
    assert names == ["made_up", "on_disk"]
