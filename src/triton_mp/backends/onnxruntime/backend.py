"""The onnxruntime backend: one ``InferenceSession`` per model instance.

Imported only by worker processes (through ``backends.registry``). The config's session and
run options, execution providers and custom-op libraries come from
``backends.onnxruntime.options`` (Triton's onnxruntime backend parameters, graph level and
execution accelerators).

NOTE: without ``intra_op_thread_count`` in the config, a session gets one intra-op thread per
usable core less one (``options.default_intra_op_threads``), not onnxruntime's one per core:
the frontend that feeds the instance needs a core while the model runs, and a pool that
covers every core makes the two preempt each other; each extra non-spinning thread also
costs CPU to wake per operator. On the 2-core bench machine ocr_cls's worker thus runs one
thread and spends about a fifth less CPU per image, which the frontend and the client get
instead (bench/README.md, ``bench_ocr_cls.py``). An explicit value, 0 included, is passed to
onnxruntime as it is (0: one thread per core). An instance pinned by a host policy
(``cpu-cores``) gets one thread per core it was given.

NOTE: intra-op threads do not spin while idle by default here
(``session.intra_op.allow_spinning=0``): each model instance is its own process, and on a
machine with few cores spinning pool threads of one instance steal the cores that the
frontends, the scheduler and the other instances need. A model can set it back to "1".
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime import NodeArg

from triton_mp.backends.base import (
    BackendRequest,
    PhaseTimes,
    Result,
    SequenceBatch,
    Stopwatch,
    gather,
    gather_rows,
    scatter,
)
from triton_mp.backends.onnxruntime import options
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.ipc.protocol.specs import InstanceSpec, ModelVersionSpec

log = logging.getLogger(__name__)


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

    Sequence models: every control input (``[batch, 1]`` when batching, else ``[1]``, of the
    control's datatype) and every implicit state (``state.input_name`` a graph input and
    ``state.output_name`` a graph output, of the state's datatype and dims) must be in the
    graph too. Such graph inputs are fed by the worker, never listed as config inputs.

    Raises:
        ConfigError: naming the model, the tensor and both sides.
    """
    graph_inputs = {t.name: t for t in session.get_inputs()}
    graph_outputs = {t.name: t for t in session.get_outputs()}
    graph = {**graph_inputs, **graph_outputs}
    batch = (-1,) if model.max_batch_size > 0 else ()
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for t in tensors:
            g = graph.get(t.name)
            if g is None:
                raise ConfigError(
                    f"unable to load model '{model.model}', configuration expects {kind} "
                    f"'{t.name}' but the model does not provide it"
                )
            dims = t.reshape if t.reshape is not None else t.dims
            _check_graph_tensor(model.model, kind, t.name, t.datatype, batch + tuple(dims), g)
    if model.sequence is None:
        return
    for c in model.sequence.controls:
        g = graph_inputs.get(c.name)
        if g is None:
            raise ConfigError(
                f"unable to load model '{model.model}', configuration specifies sequence "
                f"control '{c.name}' ({c.kind}) but the model does not provide that input"
            )
        _check_graph_tensor(model.model, "sequence control", c.name, c.datatype, batch + (1,), g)
    for st in model.sequence.states:
        for kind, name, side in (
            ("state input", st.input_name, graph_inputs),
            ("state output", st.output_name, graph_outputs),
        ):
            g = side.get(name)
            if g is None:
                raise ConfigError(
                    f"unable to load model '{model.model}', configuration specifies {kind} "
                    f"'{name}' but the model does not provide it; the model's "
                    f"{kind.split()[1]}s are: {', '.join(sorted(side))}"
                )
            _check_graph_tensor(model.model, kind, name, st.datatype, batch + st.dims, g)


def _check_graph_tensor(
    model: str, kind: str, name: str, datatype: str, want: tuple[int, ...], g: NodeArg
) -> None:
    """Compare one config tensor with its graph tensor: data type, rank, fixed dimensions.

    Raises:
        ConfigError: naming the model, the tensor and both sides.
    """
    g_type = _ORT_TYPES.get(g.type, g.type)
    if g_type != datatype:
        raise ConfigError(
            f"unable to load model '{model}', configuration expects datatype "
            f"TYPE_{'STRING' if datatype == 'BYTES' else datatype} for {kind} "
            f"'{name}', model provides {g.type}"
        )
    got = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in g.shape)
    if len(got) != len(want) or any(
        w != -1 and g_ != -1 and w != g_ for w, g_ in zip(want, got, strict=True)
    ):
        raise ConfigError(
            f"unable to load model '{model}', {kind} '{name}' dims "
            f"{list(want)} (batch dimension included) don't match the model's "
            f"{list(got)}"
        )


_ORT_STATUS = re.compile(r"\[ONNXRuntimeError\] : (\d+) : \w+ : (.*)", re.DOTALL)
"""How onnxruntime's Python binding renders an ``OrtStatus``: code, code name, message."""


def ort_run_error(exc: Exception) -> Exception:
    """A failed ``InferenceSession.run`` as Triton's onnxruntime backend words it:
    INTERNAL "onnx runtime error <code>: <message>" (``RETURN_IF_ORT_ERROR``, with the
    ``OrtErrorCode`` and ``GetErrorMessage`` of the status). Anything that is not an
    ``OrtStatus`` comes back as it is."""
    m = _ORT_STATUS.fullmatch(str(exc))
    if m is None:
        return exc
    return TritonMPError(f"onnx runtime error {m.group(1)}: {m.group(2)}", ErrorCode.INTERNAL)


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

    writes_inputs = False
    """onnxruntime reads a run's inputs and never writes them (a graph input is not a
    buffer its planner reuses), and a batch of several requests is gathered into a new
    array first: the worker views inputs two requests of a batch read from one client
    window without a copy each (``workers.tensors.tensor_io.ClientRegions``)."""

    def __init__(self, model: ModelVersionSpec, instance: InstanceSpec) -> None:
        self._spec = model
        settings = options.session_settings(
            json.loads(model.config_json),
            model.model,
            instance.kind,
            instance.cpu_cores,
            tuple(ort.get_available_providers()),
            options.default_intra_op_threads(),
        )
        for warning in settings.warnings:
            log.warning("model '%s': %s", model.model, warning)
        opts, run_options = options.build(settings)
        # NOTE: RunOptions only when the config sets a run entry: the plain call is the
        # hot path.
        self._run_options = run_options if settings.run_entries else None
        providers = list(settings.providers)
        self._session = ort.InferenceSession(model.model_file, opts, providers=providers)
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._state_inputs = tuple(
            s.input_name for s in (model.sequence.states if model.sequence else ())
        )
        check_config_against_model(model, self._session)
        log.info(
            "onnxruntime session for %s ready on %s (%d intra-op threads, graph %s)",
            model.model_file,
            providers[0],
            settings.intra_op_threads,
            settings.graph_level,
        )

    def execute(
        self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None = None
    ) -> tuple[list[Result], PhaseTimes]:
        """Gather, run once for the whole batch, scatter back per request.

        With ``sequence`` (sequence models) the batch has ``sequence.rows`` rows: null rows
        get garbage inputs, the control tensors and the requests' state inputs are fed, and
        only the requests' own rows come back.

        Raises:
            TritonMPError (INVALID_ARG): a string input that is not UTF-8, or an optional
                input some requests of a sequence batch give and others do not;
            onnxruntime exceptions when the run fails.
        """
        watch = Stopwatch()
        if sequence is None:
            feeds = gather(self._spec, requests)
        else:
            feeds = gather_rows(self._spec, requests, sequence, self._state_inputs)
            feeds.update(sequence.controls)
        for name, arr in feeds.items():
            if arr.dtype == np.object_:
                feeds[name] = _to_str_array(name, arr)
        t_input = watch.lap()
        wanted = sorted({n for r in requests for n in r.outputs})
        try:
            if self._run_options is None:
                arrays = self._session.run(wanted, feeds)
            else:
                arrays = self._session.run(wanted, feeds, self._run_options)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's binding raises its own classes
            raise ort_run_error(exc) from exc
        t_infer = watch.lap()
        outputs = {n: np.asarray(a) for n, a in zip(wanted, arrays, strict=True)}
        starts = None if sequence is None else sequence.slots
        return scatter(self._spec, requests, outputs, starts), PhaseTimes(t_input, t_infer)

    def close(self) -> None:
        """Drop the session."""
        del self._session
