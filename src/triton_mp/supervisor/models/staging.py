"""Step 1 of a model change: read and check what each load names, stage what may load.

Imported by ``supervisor.models.model_control`` and run on its change thread. A request whose
model reads and validates becomes a ``load_requests.Staged`` (its versions' fingerprints
taken); one that does not is refused here (``Stager.refuse``): what serves keeps serving,
the failed versions are listed UNAVAILABLE with the reason, as 2.51's RepositoryIndex does,
and the frontends learn it at once (``ModelTableUpdate``, not acknowledged). A staged
ensemble brings its composing models into the change (Triton's polling chain) and is
checked against them (``ensemble_deps.check_ensembles``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import ErrorCode, status_text
from triton_mp.ipc.protocol.control_messages import ModelTableUpdate
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.model_config.loader import directory_fingerprint
from triton_mp.supervisor.models.ensemble_deps import (
    check_ensembles,
    composing_to_load,
    ensemble_load_failure,
    steps_of,
)
from triton_mp.supervisor.models.load_requests import (
    LoadRequest,
    Staged,
    files_fingerprint,
    load_answer,
    load_failure,
    read_request,
    remove_temp_dir,
    updated_in_place,
    version_dirs,
    version_fingerprint,
)
from triton_mp.supervisor.models.model_changes import failed_by_invalid_config
from triton_mp.supervisor.models.served_models import ServedModel, served_configs

log = logging.getLogger(__name__)


class Stager:
    """Stages the requests of one change at a time (see the module docstring).

    Args:
        config: the server's flags (repository, limits).
        server_id: the supervisor's pid (names temporary model directories).
        models: the served models by name, shared with ``ModelControl`` (a model staged for
            the first time gets its record here).
        seen: per model directory, its fingerprint at the last load attempt (poll mode),
            shared with ``ModelControl``; ``read_request`` updates it.
        supported_ids: the GPUs a model may name (``Devices.supported_ids``).
        update: sends a ``ModelTableUpdate`` to every frontend, not acknowledged.
    """

    def __init__(
        self,
        config: ServerConfig,
        server_id: str,
        models: dict[str, ServedModel],
        seen: dict[str, str],
        supported_ids: tuple[int, ...],
        update: Callable[[ModelTableUpdate], None],
    ) -> None:
        self._cfg = config
        self._server_id = server_id
        self._models = models
        self._seen = seen
        self._supported_ids = supported_ids
        self._update = update

    def keep_override(self, req: LoadRequest) -> None:
        """A load without ``config`` after one with a ``config`` override, the model's
        directory untouched since, keeps the override's config serving and its statistics
        going, as 2.51 does: core reloads a loaded model only when its files changed
        (``ModelRepositoryManager``'s modification check), and only an unload returns it to
        ``config.pbtxt``. The override is applied again, which ``plan_change`` finds
        unchanged. Each composing model the polling chain brings in gets it too."""
        model = self._models.get(req.name)
        if req.config_json is not None or req.files or model is None or not model.versions:
            return
        if model.override is None:
            return
        config_json, fingerprint = model.override
        if directory_fingerprint(self._cfg.repository_path / req.name) == fingerprint:
            req.config_json = config_json

    def stage(self, req: LoadRequest) -> Staged | None:
        """Step 1 for one request; None when it ends here (``req.result`` says why)."""
        rm, temp_dir = read_request(
            req, self._cfg, self._server_id, self._seen, self._supported_ids
        )
        if rm is None:
            return None
        self._models.setdefault(req.name, ServedModel(req.name))
        if rm.error is not None or rm.config is None:
            failed = {v: status_text(rm.error_code, rm.error or "") for v in rm.failed_versions}
            model = self._models[req.name]
            ready = (
                model.versions if rm.config and updated_in_place(model.config, rm.config) else ()
            )
            why = load_failure(req.name, failed, ready).message if failed else rm.error
            self.refuse(req, rm.directory, temp_dir, why or "failed to load", failed, ready)
            req.result = load_answer(req, rm)
            return None
        config = rm.config.SerializeToString(deterministic=True)
        fps = {v.version: version_fingerprint(rm.directory, config, v.version) for v in rm.versions}
        files = {v.version: files_fingerprint(rm.directory, v.version) for v in rm.versions}
        return Staged(req, rm, temp_dir, fps, files)

    def refuse(
        self,
        req: LoadRequest,
        directory: Path,
        temp_dir: Path | None,
        why: str,
        failed: dict[int, str] | None = None,
        ready: Iterable[int] = (),
    ) -> None:
        """A model that read (or checked) badly: what serves keeps serving, the rest fails.
        ``failed``: the versions that failed a check Triton makes per version, and why (each
        listed UNAVAILABLE with it, as 2.51's RepositoryIndex does); ``ready``: the served
        versions the config would have updated in place (listed READY with the reason of a
        per-version failure)."""
        model = self._models[req.name]
        req.result = ErrorInfo(ErrorCode.INVALID_ARG, why)
        remove_temp_dir(temp_dir)
        if not model.versions:
            model.unloaded = False
            model.reason = req.result.message
            model.config = b""
            if failed:
                model.failed = dict(failed)
                # NOTE: a failed version replaces one still draining in the index, as in
                # ``change_effects.apply_plan``.
                model.unloading -= set(failed)
        else:
            reason = next(iter(failed.values())) if failed else req.result.message
            model.failed = failed_by_invalid_config(model.served(), version_dirs(directory), reason)
            for v in ready if failed else ():
                model.versions[v].reason = reason
        log.error("failed to load model '%s': %s", req.name, req.result.message)
        self._update(ModelTableUpdate(models=(model.entry(),)))

    def with_ensembles(
        self, staged: list[Staged], requests: list[LoadRequest], poll_steps: bool = True
    ) -> list[Staged]:
        """Stage the composing models of staged ensembles too (Triton's polling chain:
        ``poll_steps``, those that serve as well, whose changed files then reload), check
        the ensembles against them (``ensemble_deps.check_ensembles``) and order the
        staged models so that ensembles come last."""
        served: dict[str, mc.ModelConfig] = served_configs(self._models.values())
        tried = {r.name for r in requests} | (set() if poll_steps else set(served))
        every = list(requests)
        while extra := [
            n
            for n in composing_to_load({s.req.name: s.rm.config for s in staged})
            if n not in tried
        ]:
            tried.update(extra)
            more = [LoadRequest(n) for n in extra]
            for r in more:
                self.keep_override(r)
            every.extend(more)
            staged.extend(s for s in map(self.stage, more) if s is not None)
        failed = {r.name: r.result.message for r in every if r.result and r.name in self._models}
        configs = {s.req.name: s.rm.config for s in staged if s.rm.config is not None}
        reasons = check_ensembles(configs, failed, served)
        for s in [s for s in staged if s.req.name in reasons]:
            staged.remove(s)
            self.refuse(s.req, s.rm.directory, s.temp_dir, reasons[s.req.name])
            s.req.result = ensemble_load_failure(s.req.name, reasons[s.req.name])
        # NOTE: check_ensembles set decoupled in the configs that serve (the fingerprints,
        # taken before, do not depend on it: it follows from the composing models).
        return sorted(staged, key=lambda s: bool(steps_of(s.rm.config)))
