"""Whether a model version's new generation is a new model to Triton (its statistics start
again) or the old one updated in place.

Imported by ``scheduler.lifecycle`` when a generation replaces an active one; pure. Core
``ModelLifeCycle::AsyncLoad`` updates a served version (not an ensemble's) in place when its
version directory is unmodified and ``ConfigChangeRequiresReload`` is false: the configs
differ at most in ``instance_group`` and ``version_policy``. Anything else creates a new
``Model`` object, whose statistics start at 0 (the Prometheus counters, kept by a reporter
the old and new model share, go on). The supervisor replaces a version only when its
effective config or its files changed, so a replacement whose config is the same is a file
change: a new model too.
"""

from __future__ import annotations

import json
from typing import Any

UPDATED_IN_PLACE = ("instance_group", "version_policy")
"""The ModelConfig fields core's ``ConfigChangeRequiresReload`` ignores."""


def is_new_model(old_config_json: str, new_config_json: str) -> bool:
    """Whether replacing the generation whose effective config is ``old_config_json`` by
    one with ``new_config_json`` (both Triton's JSON form of a ModelConfig,
    ``ModelVersionSpec.config_json``) makes a new model: true unless the two differ, and
    differ only in ``UPDATED_IN_PLACE``; always true for an ensemble (core never updates
    one in place)."""
    old, new = json.loads(old_config_json), json.loads(new_config_json)
    if old == new or new.get("platform") == "ensemble":
        return True  # NOTE: replaced with the same config: its files changed
    return _without_in_place(old) != _without_in_place(new)


def _without_in_place(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in UPDATED_IN_PLACE}
