"""Backends declare what they can do in their registry row; the roles ask the declaration.

The python backend is the one with BLS, custom metrics, ``is_cancelled()`` during execute and
the ``is_ready()`` hook; the planner copies its row's capabilities into every version's spec,
the supervisor hands the readiness hook on to the frontends' model table, and no module of
the package decides by comparing a backend's name with "python".
"""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec

from triton_mp.backends.registry import BACKENDS
from triton_mp.ipc.protocol.control_messages import ModelEntry
from triton_mp.ipc.protocol.specs import BackendCapabilities, BatchingSpec, ModelVersionSpec

SRC = Path(__file__).resolve().parents[2] / "src" / "triton_mp"


def test_the_python_backend_declares_its_capabilities() -> None:
    assert BACKENDS["python"].capabilities == BackendCapabilities(
        bls=True, custom_metrics=True, cancellation_watch=True, readiness_hook=True
    )
    for name in ("onnxruntime", "pytorch", "tensorrt"):
        assert BACKENDS[name].capabilities == BackendCapabilities(), name


def test_no_module_compares_a_name_with_python() -> None:
    found = []
    for path in SRC.rglob("*.py"):
        if "_proto" in path.parts or path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(isinstance(o, ast.Constant) and o.value == "python" for o in operands):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"ask BACKENDS[...].capabilities instead: {found}"


def test_capabilities_travel_in_the_spec_and_the_model_entry() -> None:
    caps = BACKENDS["python"].capabilities
    spec = msgspec.msgpack.decode(
        msgspec.msgpack.encode(
            ModelVersionSpec(
                model="m", version=1, backend="python", model_file="/m/1/model.py",
                max_batch_size=0, batching=BatchingSpec(),
                inputs=(), outputs=(), instance_ids=(1,), capabilities=caps,
            )
        ),
        type=ModelVersionSpec,
    )  # fmt: skip
    assert spec.capabilities == caps
    entry = ModelEntry(name="m", config=b"", ready_versions=(1,), readiness_hook=True)
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(entry), type=ModelEntry)
    assert again.readiness_hook
