"""The checkpoint file: every result measured so far, so an interrupted run resumes.

Written after each point (to a temporary file, then renamed over the old one, so an
interrupt never leaves half a file). It records a fingerprint of the settings that decide
what is measured (model, search space and mode, constraints, objectives, load generator and
its window); a run resumes only from a checkpoint with the same fingerprint, and replays
its results through the search, which then asks for the points not measured yet.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import msgspec

from triton_mp.analyze.sweep.results import Result

FORMAT_VERSION = 1


class CheckpointError(Exception):
    """The checkpoint cannot be used (other settings, unreadable, another format)."""


class Checkpoint(msgspec.Struct, kw_only=True):
    """The file's content.

    Attributes:
        version: ``FORMAT_VERSION``.
        fingerprint: ``fingerprint(settings)`` of the run that wrote it.
        settings: those settings, for a person reading the file.
        results: every measured point, in measurement order.
        configs: variant key -> the effective config the server served for it (Triton's
            JSON form; ``shipped``: the model's config as found), for the config files.
    """

    version: int = FORMAT_VERSION
    fingerprint: str
    settings: dict[str, object]
    results: list[Result] = []
    configs: dict[str, dict[str, Any]] = {}


def fingerprint(settings: dict[str, object]) -> str:
    """A short hash of ``settings`` (JSON with sorted keys)."""
    data = msgspec.json.encode(settings, order="sorted")
    return hashlib.sha256(data).hexdigest()[:16]


def load(path: Path, settings: dict[str, object]) -> Checkpoint:
    """The checkpoint at ``path`` for ``settings``, or an empty one when there is no file.

    Raises:
        CheckpointError: the file is unreadable or was written for other settings.
    """
    fp = fingerprint(settings)
    if not path.exists():
        return Checkpoint(fingerprint=fp, settings=settings)
    try:
        ckpt = msgspec.json.decode(path.read_bytes(), type=Checkpoint)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    if ckpt.version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format {ckpt.version}, not {FORMAT_VERSION}")
    if ckpt.fingerprint != fp:
        raise CheckpointError(
            f"checkpoint {path} was written for other settings; "
            "run with the same flags to resume, or pass --fresh to start over"
        )
    return ckpt


def save(path: Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` to ``path`` atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(ckpt), indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
