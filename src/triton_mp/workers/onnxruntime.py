"""The onnxruntime backend: one ``InferenceSession`` per model instance.

Imported only by worker processes (through ``workers.registry``). Config ``parameters``
understood, as Triton's onnxruntime backend names them: ``intra_op_thread_count``,
``inter_op_thread_count`` (string integers; 0 = onnxruntime's default). Keys that start with
``session.`` are passed to ``SessionOptions.add_session_config_entry`` as they are.

NOTE: intra-op threads do not spin while idle by default here
(``session.intra_op.allow_spinning=0``): each model instance is its own process, and on a
machine with few cores spinning pool threads of one instance steal the cores that the
frontends, the scheduler and the other instances need. A model can set it back to "1".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from triton_mp.config import InstanceSpec, ModelVersionSpec
from triton_mp.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.workers.backend import BackendRequest, PhaseTimes, Result, Stopwatch, gather, scatter

log = logging.getLogger(__name__)


def _int_parameter(params: dict[str, object], key: str) -> int:
    entry = params.get(key)
    if isinstance(entry, dict):
        try:
            return int(str(entry.get("string_value", "0")))
        except ValueError:
            log.warning("parameter %s=%r is not an integer; ignored", key, entry)
    return 0


_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}
"""onnxruntime's type strings -> protocol datatypes."""


def check_config_against_model(model: ModelVersionSpec, session: ort.InferenceSession) -> None:
    """Refuse to load when the config contradicts the graph, as Triton's onnxruntime backend
    does: a config tensor the graph lacks, another data type, or a fixed dimension that
    differs (batch dimension included when max_batch_size > 0).

    Raises:
        ConfigError: naming the model, the tensor and both sides.
    """
    graph = {t.name: t for t in (*session.get_inputs(), *session.get_outputs())}
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for t in tensors:
            g = graph.get(t.name)
            if g is None:
                raise ConfigError(
                    f"unable to load model '{model.model}', configuration expects {kind} "
                    f"'{t.name}' but the model does not provide it"
                )
            g_type = _ORT_TYPES.get(g.type, g.type)
            if g_type != t.datatype:
                raise ConfigError(
                    f"unable to load model '{model.model}', configuration expects datatype "
                    f"TYPE_{'STRING' if t.datatype == 'BYTES' else t.datatype} for {kind} "
                    f"'{t.name}', model provides {g.type}"
                )
            dims = t.reshape if t.reshape is not None else t.dims
            want = ((-1,) if model.max_batch_size > 0 else ()) + tuple(dims)
            got = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in g.shape)
            if len(got) != len(want) or any(
                w != -1 and g_ != -1 and w != g_ for w, g_ in zip(want, got, strict=True)
            ):
                raise ConfigError(
                    f"unable to load model '{model.model}', {kind} '{t.name}' dims "
                    f"{list(want)} (batch dimension included) don't match the model's "
                    f"{list(got)}"
                )


def _to_str_array(name: str, arr: np.ndarray) -> np.ndarray:
    """BYTES elements as ``str``: onnxruntime's Python binding stores ``str(obj)`` for any
    other object, so bytes must be decoded (string tensors are UTF-8 in onnxruntime).

    Raises:
        TritonMPError (INVALID_ARG): an element is not valid UTF-8.
    """
    out = np.empty(arr.size, dtype=np.object_)
    for i, item in enumerate(arr.reshape(-1)):
        try:
            out[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError:
            raise TritonMPError(
                f"input '{name}': onnxruntime string tensors hold UTF-8 text; element {i} "
                "is not valid UTF-8",
                ErrorCode.INVALID_ARG,
            ) from None
    return out.reshape(arr.shape)


class OnnxRuntimeBackend:
    """Runs an ONNX model on CPU (or CUDA for KIND_GPU when onnxruntime-gpu is installed).

    Raises (from the constructor):
        onnxruntime exceptions when the model file cannot be loaded; ConfigError when the
        config's inputs/outputs contradict the model's (see ``check_config_against_model``).
    """

    def __init__(self, model: ModelVersionSpec, instance: InstanceSpec) -> None:
        self._spec = model
        params = json.loads(model.config_json).get("parameters", {})
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _int_parameter(params, "intra_op_thread_count")
        opts.inter_op_num_threads = _int_parameter(params, "inter_op_thread_count")
        session_entries = {
            "session.intra_op.allow_spinning": "0",
            "session.inter_op.allow_spinning": "0",
        }
        for key, entry in params.items():
            if key.startswith("session.") and isinstance(entry, dict):
                session_entries[key] = str(entry.get("string_value", ""))
        for key, value in session_entries.items():
            opts.add_session_config_entry(key, value)
        providers = ["CPUExecutionProvider"]
        if instance.kind == "KIND_GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        self._session = ort.InferenceSession(model.model_file, opts, providers=providers)
        self._output_names = [o.name for o in self._session.get_outputs()]
        check_config_against_model(model, self._session)
        log.info("onnxruntime session for %s ready on %s", model.model_file, providers[0])

    def execute(self, requests: Sequence[BackendRequest]) -> tuple[list[Result], PhaseTimes]:
        """Gather, run once for the whole batch, scatter back per request."""
        watch = Stopwatch()
        feeds = gather(self._spec, requests)
        for name, arr in feeds.items():
            if arr.dtype == np.object_:
                feeds[name] = _to_str_array(name, arr)
        t_input = watch.lap()
        wanted = sorted({n for r in requests for n in r.outputs})
        arrays = self._session.run(wanted, feeds)
        t_infer = watch.lap()
        outputs = {n: np.asarray(a) for n, a in zip(wanted, arrays, strict=True)}
        return scatter(self._spec, requests, outputs), PhaseTimes(t_input, t_infer)

    def close(self) -> None:
        """Drop the session."""
        del self._session
