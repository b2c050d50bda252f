"""How a python model's ``model.py`` is imported: ``triton_python_backend_utils`` installed,
the file loaded under a unique module name, its ``TritonPythonModel`` class found.

Imported by ``backends.python.backend`` (worker processes) and the auto-complete child
(``backends.python.autocomplete``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import re
import sys
import sysconfig
import types
from pathlib import Path

from triton_mp.backends.python import pb_utils
from triton_mp.common.errors import ErrorCode, TritonMPError

PB_UTILS_MODULE = "triton_python_backend_utils"
"""The name user models import our ``pb_utils`` under."""

MODEL_CLASS = "TritonPythonModel"
"""The class a python model must define."""

_module_ids = itertools.count()
_UNSAFE = re.compile(r"[^0-9A-Za-z_]")


def install_pb_utils() -> None:
    """Make ``import triton_python_backend_utils`` give our ``pb_utils``."""
    sys.modules[PB_UTILS_MODULE] = pb_utils


def describe_exception(exc: BaseException) -> str:
    """``"Class: message"`` for an exception raised by user code (no module path)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_PACKAGE = str(Path(__file__).resolve().parents[2])
"""triton-mp's package directory."""
_CALLERS = (_PACKAGE, sysconfig.get_paths()["stdlib"])
"""Where the frames that call a model's method live: triton-mp and the standard library."""


def describe_execute_failure(exc: BaseException) -> str:
    """An exception ``execute`` raised, as the python backend's stub words it (pybind11's
    ``error_already_set::what()``): ``describe_exception``'s text, then, when the model's own
    code is on the traceback, "\n\nAt:\n" and one "  <file>(<line>): <function>\n" per
    frame, the innermost first, from the model's code up to the frame triton-mp called. Left
    out: the callers (ours or the standard library's: the stub has none) and triton-mp's
    frames the model called last (``pb_utils``, C++ in Triton: no frames there)."""
    frames: list[tuple[str, int, str]] = []
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_CALLERS):
        tb = tb.tb_next
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    while frames and frames[-1][0].startswith(_PACKAGE):
        frames.pop()
    text = describe_exception(exc)
    if not frames:
        return text
    return text + "\n\nAt:\n" + "".join(f"  {f}({n}): {name}\n" for f, n, name in reversed(frames))


def import_model_module(model_file: str | Path, model_name: str) -> types.ModuleType:
    """Import a model's ``model.py`` under a fresh, unique module name.

    Like Triton, the version directory and the model directory are appended to ``sys.path``
    (so ``import helper`` finds a module next to model.py), and the file is imported as a
    module of a package whose path is the version directory (so ``from . import helper``
    works too); ``pb_utils.get_model_dir()`` gives that version directory from then on.

    Raises:
        whatever importing the user's file raises.
    """
    path = Path(model_file).resolve()
    version_dir = path.parent
    pb_utils.set_model_dir(str(version_dir))
    for directory in (str(version_dir), str(version_dir.parent)):
        if directory not in sys.path:
            sys.path.append(directory)
    package = f"_triton_mp_model_{_UNSAFE.sub('_', model_name)}_{next(_module_ids)}"
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(version_dir)]
    sys.modules[package] = pkg
    name = f"{package}.{_UNSAFE.sub('_', path.stem) or 'model'}"
    # NOTE: an explicit SourceFileLoader, so a default_model_filename without ".py" works.
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def model_class(module: types.ModuleType, model_file: str | Path) -> type:
    """The module's ``TritonPythonModel`` class.

    Raises:
        TritonMPError (INVALID_ARG): the file defines no such class.
    """
    cls = getattr(module, MODEL_CLASS, None)
    if not isinstance(cls, type):
        raise TritonMPError(
            f"{model_file} does not define class '{MODEL_CLASS}'", ErrorCode.INVALID_ARG
        )
    return cls
