"""How a python model's ``model.py`` is imported: ``triton_python_backend_utils`` installed,
the file loaded under a unique module name, its ``TritonPythonModel`` class found.

Imported by ``backends.python.backend`` (worker processes) and the auto-complete child
(``backends.python.autocomplete``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import re
import sys
import sysconfig
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    if isinstance(exc, MissingExecute):
        return str(exc)
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
    return _stub_words(exc, frames[::-1])


def _stub_words(exc: BaseException, frames: list[tuple[str, int, str]]) -> str:
    """pybind11's ``error_already_set::what()`` as the stub gives it: ``describe_exception``'s
    text, then, when ``frames`` (file, line, function; the innermost first) has any,
    "\n\nAt:\n" and one "  <file>(<line>): <function>\n" per frame."""
    text = describe_exception(exc)
    if not frames:
        return text
    return text + "\n\nAt:\n" + "".join(f"  {f}({n}): {name}\n" for f, n, name in frames)


class MissingExecute(Exception):
    """What a model without ``execute`` raises for each batch; ``describe_execute_failure``
    gives its text alone, the stub's: "Python model <file> does not implement `execute`
    method." (2.51 loads such a model and fails each of its batches so)."""


def missing_execute(model_file: str | Path) -> Callable[[list[Any]], Any]:
    """The ``execute`` of a model that defines none: raises ``MissingExecute``."""
    why = f"Python model {model_file} does not implement `execute` method."

    def execute(requests: list[Any]) -> Any:
        raise MissingExecute(why)

    return execute


def describe_load_failure(exc: BaseException) -> str:
    """An exception importing the model's file, constructing ``TritonPythonModel``, or in
    ``initialize`` or ``auto_complete_config`` raised, as the stub words it (pybind11's
    ``error_already_set::what()``, which a load failure carries: "Internal: <this>"):
    ``describe_exception``'s text, then, when the innermost frame of its traceback is not
    triton-mp's, "\n\nAt:\n" and one "  <file>(<line>): <function>\n" per frame from that
    frame outwards (``f_back``) up to the frame triton-mp called (an import's frames are the
    import system's: "<frozen importlib._bootstrap>(N): _find_and_load" and its callees; a
    SyntaxError, raised before the file runs, has none)."""
    innermost: types.TracebackType | None = None
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_CALLERS):
            innermost = tb  # NOTE: triton-mp's frames the model called are C++ in the stub
        tb = tb.tb_next
    if innermost is None:
        return describe_exception(exc)
    frames: list[tuple[str, int, str]] = []
    frame: types.FrameType | None = innermost.tb_frame
    lineno = innermost.tb_lineno
    while frame is not None and not frame.f_code.co_filename.startswith(_CALLERS):
        frames.append((frame.f_code.co_filename, lineno, frame.f_code.co_name))
        frame = frame.f_back
        lineno = frame.f_lineno if frame is not None else 0
    return _stub_words(exc, frames)


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
    # NOTE: imported through ``__import__`` (the stub's PyImport_ImportModule), so a failure's
    # frames are those ``describe_load_failure`` shows in the stub's words.
    finder = _OneSpec(spec)
    sys.meta_path.insert(0, finder)
    try:
        __import__(name)
    finally:
        sys.meta_path.remove(finder)
    return sys.modules[name]


class _OneSpec(importlib.abc.MetaPathFinder):
    """Finds one module: ``spec``'s."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        self.spec = spec

    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return self.spec if fullname == self.spec.name else None


def model_class(module: types.ModuleType, model_file: str | Path) -> Any:
    """The module's ``TritonPythonModel`` (a class, or whatever the file bound to the name:
    calling something else fails as it fails in the stub, a ``TypeError``).

    Raises:
        TritonMPError (INTERNAL): the file binds no such name, in the stub's words:
            "AttributeError: module '<version>.<file stem>' has no attribute
            'TritonPythonModel'" (it imports the file as that module).
    """
    if not hasattr(module, MODEL_CLASS):
        path = Path(model_file)
        stub_name = f"{path.parent.name}.{path.stem}"
        raise TritonMPError(
            f"AttributeError: module '{stub_name}' has no attribute '{MODEL_CLASS}'",
            ErrorCode.INTERNAL,
        )
    return getattr(module, MODEL_CLASS)
