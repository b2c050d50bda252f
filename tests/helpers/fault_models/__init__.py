"""Python models that misbehave on purpose, for the fault-injection tests.

``faulty.py`` is one ``model.py`` for every fault; ``write_faulty_model`` puts a copy in a
test repository with the fault named in its config's ``parameters``. Requests whose
``INPUT0`` is 1 trigger the fault; any other value is echoed back (after ``sleep_ms``), so
one model serves both the normal traffic and the fault.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MODEL_FILE = Path(__file__).with_name("faulty.py")

FAULTS = ("none", "segfault", "hang_in_c", "sleep", "leak")
"""``segfault``: SIGSEGV; ``hang_in_c``: libc sleep called with the GIL held (a hung C
extension); ``sleep``: ``time.sleep`` for ``sleep_ms`` (busy, not hung); ``leak``: keep
64 MiB more per triggering request."""


def write_faulty_model(
    repo: Path, name: str, fault: str, *, count: int = 1, sleep_ms: int = 0, dims: str = "1"
) -> Path:
    """Write model ``name`` (python backend, ``INPUT0``/``OUTPUT0`` FP32 of ``dims``, no
    batching, ``count`` CPU instances) into ``repo``. Returns the model directory."""
    assert fault in FAULTS, fault
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    shutil.copy(MODEL_FILE, model_dir / "1" / "model.py")
    (model_dir / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: 0\n'
        f'input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [{dims}] }}]\n'
        f'output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [{dims}] }}]\n'
        f"instance_group [{{ count: {count}, kind: KIND_CPU }}]\n"
        f'parameters {{ key: "fault" value: {{ string_value: "{fault}" }} }}\n'
        f'parameters {{ key: "sleep_ms" value: {{ string_value: "{sleep_ms}" }} }}\n'
    )
    return model_dir
