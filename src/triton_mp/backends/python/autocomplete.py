"""Python ``auto_complete_config``, run in a throwaway child process.

Triton calls a python model's static ``TritonPythonModel.auto_complete_config`` at load, in an
interpreter it discards afterwards. The supervisor must never run user code itself, so
``auto_complete`` (the backend registry's hook, called by the model-config loader) starts
``python -m triton_mp.backends.python.autocomplete <model file> <model name>``, writes the
config (Triton's JSON form) to its stdin and reads the completed config back.

Protocol of the child: stdin is the config JSON; the answer is one JSON object on the
child's *original* stdout, ``{"config": {...}}`` (``null`` when the model defines no
``auto_complete_config``) or ``{"error": "..."}``. Everything the model prints goes to
stderr (the child points its fd 1 at fd 2 before importing the model), which the parent
forwards to its log. The child always exits 0 after answering.

This module's top level imports only the standard library, protobuf and ``triton_mp.common``:
the supervisor imports it; the child-only imports (numpy, pb_utils) happen in ``main``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from triton_mp._proto import model_config_pb2
from triton_mp.backends.registry import AutoCompleteOptions
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.common.json_form import config_to_json

log = logging.getLogger(__name__)

AUTO_COMPLETE_TIMEOUT_S = 30.0
"""How long a model's import plus ``auto_complete_config`` may take (Triton's default
``stub-timeout-seconds``)."""

RETURN_CHECK = "auto_complete_config function in model"
"""python_be.cc's refusal of what ``auto_complete_config`` returned begins so; then
`` '<m>' must return a valid pb.ModelConfig object.``"""

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
"""The directory holding the ``triton_mp`` package this process runs."""


def auto_complete(
    config: model_config_pb2.ModelConfig, model_file: Path, options: AutoCompleteOptions
) -> None:
    """Let the model's ``auto_complete_config`` complete ``config``, in a child process.

    The supervisor never runs user code: the child imports model.py in a throwaway
    interpreter, as Triton does. A model without ``auto_complete_config`` leaves the config
    as it is. ``options`` is unused (the model's own code decides everything).

    Raises:
        ConfigError: the model's code raised or timed out, or the config it returned does not
            parse or renames the model or changes its backend.
    """
    del options
    if not may_auto_complete(model_file):
        return
    name = config.name
    completed = run_auto_complete(config_to_json(config), model_file, name)
    if completed is None:
        return
    new = model_config_pb2.ModelConfig()
    try:
        json_format.ParseDict(completed, new)
    except json_format.ParseError as exc:
        raise ConfigError(
            f"failed to load '{name}': auto_complete_config returned an invalid model "
            f"configuration: {exc}"
        ) from None
    if new.name != config.name or new.backend != config.backend:
        raise ConfigError(
            f"failed to load '{name}': auto_complete_config must not change the model's name "
            f"or backend (got name '{new.name}', backend '{new.backend}')"
        )
    config.CopyFrom(new)


def run_auto_complete(
    config: dict[str, Any],
    model_file: Path,
    model_name: str,
    timeout_s: float = AUTO_COMPLETE_TIMEOUT_S,
) -> dict[str, Any] | None:
    """Run the model's ``auto_complete_config`` on ``config`` in a child process.

    Args:
        config: the model config in Triton's JSON form (``common.json_form.config_to_json``).
        model_file: the model's ``model.py``.
        model_name: for messages.
        timeout_s: limit for the whole child (interpreter start, import, the call).

    Returns:
        The completed config (JSON form), or None when the model has no
        ``auto_complete_config``.

    Raises:
        ConfigError: the model's code raised or returned something else than the
            ``ModelConfig`` (INTERNAL, in the stub's words: a version's load failure), or did
            not finish in time; the child's output is logged.
    """
    env = dict(os.environ)
    # NOTE: the child must import this same triton_mp, whichever copy pip installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", __name__, str(model_file), model_name]
    where = f"auto_complete_config of model '{model_name}' ({model_file})"
    try:
        proc = subprocess.run(  # noqa: S603 - our own interpreter and module
            cmd,
            input=json.dumps(config).encode(),
            capture_output=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        _forward(model_name, e.stderr or b"")
        raise ConfigError(
            f"failed to load '{model_name}': {where} did not finish within {timeout_s:g} s"
        ) from None
    _forward(model_name, proc.stderr)
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        answer = None
    if proc.returncode != 0 or not isinstance(answer, dict):
        raise ConfigError(
            f"failed to load '{model_name}': {where} failed (exit status {proc.returncode}); "
            "see the server log"
        )
    if "error" in answer:
        # NOTE: as the stub's failure of a version's load: core words it "Internal: <why>".
        raise ConfigError(answer["error"], ErrorCode.INTERNAL)
    completed = answer.get("config")
    if completed is not None and not isinstance(completed, dict):
        raise ConfigError(f"failed to load '{model_name}': {where} returned no config")
    return completed


def may_auto_complete(model_file: Path) -> bool:
    """Whether ``model_file`` may define ``auto_complete_config``, judged from its source.

    False only when the source is valid Python whose top-level ``TritonPythonModel`` is a
    plain class (no base classes other than ``object``, no decorators, no metaclass) and
    the name ``auto_complete_config`` appears nowhere in the file, or when the file never
    names ``TritonPythonModel`` (the worker then reports the missing class at load). Everything else
    goes to the child, which imports the model as Triton does.

    NOTE: this spares the common model without the hook an interpreter start (~0.25 s per
    model at server start) with no loss: such a class cannot have the method.
    """
    import ast

    try:
        source = model_file.read_bytes()
        tree = ast.parse(source, str(model_file))
    except (OSError, SyntaxError, ValueError):
        return True
    if b"auto_complete_config" in source:
        return True
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel":
            plain_bases = all(isinstance(b, ast.Name) and b.id == "object" for b in node.bases)
            return not (plain_bases and not node.keywords and not node.decorator_list)
    # NOTE: a class made some other way (imported, assigned, nested in an ``if``) is left
    # to the child.
    return b"TritonPythonModel" in source


def _forward(model_name: str, stderr: bytes) -> None:
    text = stderr.decode(errors="replace").rstrip()
    if text:
        log.info("auto_complete_config of model '%s' printed:\n%s", model_name, text)


def _json_default(obj: object) -> object:
    """numpy scalars and other stragglers a model may leave in the config."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _complete(model_file: str, model_name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The child's work; returns the answer object."""
    import traceback

    from triton_mp.backends.python import pb_utils
    from triton_mp.backends.python.model_module import (
        describe_load_failure,
        import_model_module,
        install_pb_utils,
        model_class,
    )
    from triton_mp.common.errors import TritonMPError

    install_pb_utils()
    try:
        module = import_model_module(model_file, model_name)
        cls = model_class(module, model_file)
        hook = getattr(cls, "auto_complete_config", None)
        if hook is None:
            return {"config": None}
        given = pb_utils.ModelConfig(config)
        returned = hook(given)
    except TritonMPError as exc:
        return {"error": exc.message}
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        traceback.print_exc(file=sys.stderr)
        return {"error": describe_load_failure(exc)}
    if not isinstance(returned, pb_utils.ModelConfig):
        return {
            "error": f"{RETURN_CHECK} '{model_name}' must return a valid pb.ModelConfig object."
        }
    return {"config": returned.as_dict()}


def main(argv: list[str] | None = None) -> int:
    """Child entry: ``python -m triton_mp.backends.python.autocomplete FILE NAME``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m triton_mp.backends.python.autocomplete FILE NAME", file=sys.stderr)
        return 2
    # NOTE: the answer goes to the original stdout; the model's prints go to stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    config = json.loads(sys.stdin.buffer.read() or b"{}")
    answer = _complete(args[0], args[1], config)
    sys.stdout.flush()
    try:
        data = json.dumps(answer, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        data = json.dumps({"error": f"the completed config is not JSON: {e}"}).encode()
    with os.fdopen(answer_fd, "wb") as out:
        out.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
