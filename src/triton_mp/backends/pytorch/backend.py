"""The PyTorch backend (``platform: "pytorch_libtorch"``): one TorchScript module per instance.

Imported only by worker processes (through ``backends.registry``). What Triton's
``pytorch_backend`` (libtorch) does, in Python's torch:

- the module is ``torch.jit.load``-ed from the version's ``model.pt`` (or
  ``default_model_filename``) onto the instance's device: ``cpu`` for KIND_CPU, ``cuda:0``
  for KIND_GPU (the worker process sees only its GPU: ``common.process.gpus.worker_env``), and
  where it was saved for KIND_MODEL;
- inputs are matched to ``forward()``'s arguments and outputs to what it returns by
  Triton's naming rules (``backends.pytorch.naming``); config data types must be ones
  libtorch has (no unsigned 16/32/64-bit); BYTES tensors are ``List[str]`` of one dimension;
- the parameters (``backends.pytorch.parameters``): inference mode, optimized execution,
  cuDNN, the JIT knobs, intra- and inter-op thread counts, CUDA cache cleaning;
- a batch runs once: the requests' inputs are concatenated on the batch dimension, moved to
  the device, ``forward()`` runs under ``torch.no_grad`` (and ``inference_mode``), and the
  outputs come back to the host, each checked against its config data type, then split per
  request.

NOTE: without ``INTRA_OP_THREAD_COUNT`` a CPU instance gets one intra-op thread per usable
core less one (as the onnxruntime backend here, which says why): torch's default takes every
core, and the frontend feeding this process needs one. The config's explicit value is used
as it is.

Sequence batching: the control inputs (``<name>__<index>``, as Triton requires) and the
implicit state (``<name>__<index>`` states) are fed as ``forward()`` arguments at their
indices, and the state outputs taken from the returned tuple.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

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
from triton_mp.backends.pytorch.naming import IoMap, input_map, output_map
from triton_mp.backends.pytorch.parameters import TorchParameters
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.ipc.protocol.specs import InstanceSpec, ModelVersionSpec

log = logging.getLogger(__name__)

TORCH_TYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
}
"""Protocol datatype -> torch dtype: libtorch's ``ConvertDataTypeToTorchType``."""

_PROTOCOL_OF = {v: k for k, v in TORCH_TYPES.items()}

# NOTE: inputs are read-only views of shared memory; torch warns once per process when it
# wraps one. The module never writes them (forward() receives copies on GPU, and a CPU model
# that writes its inputs in place is refused by torch itself under inference mode).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
# NOTE: TorchScript is what Triton's PyTorch backend serves; torch 2.10+ calls it deprecated.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated")


def _config_name(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def check_datatypes(model: ModelVersionSpec) -> None:
    """Every input, output and state must be a type libtorch has (or a 1-D string list).

    Raises:
        ConfigError (INTERNAL): Triton's ``unsupported datatype`` or string-shape message.
    """
    batched = model.max_batch_size > 0
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for t in tensors:
            if t.datatype == "BYTES":
                dims = t.reshape if t.reshape is not None else t.dims
                if len(dims) + (1 if batched else 0) > 1:
                    raise ConfigError(
                        f"Triton only supports 1 dimensional List of String as {kind} for "
                        f"'{t.name}' for model '{model.model}'"
                    )
            elif t.datatype not in TORCH_TYPES:
                raise ConfigError(
                    f"unsupported datatype {_config_name(t.datatype)} for {kind} '{t.name}' "
                    f"for model '{model.model}'"
                )


def _device(instance: InstanceSpec, model: str) -> torch.device | None:
    """The instance's device (None: KIND_MODEL, the module's own placement).

    Raises:
        ConfigError (UNAVAILABLE): KIND_GPU where torch sees no CUDA device.
    """
    if instance.kind == "KIND_CPU":
        return torch.device("cpu")
    if instance.kind == "KIND_MODEL":
        return None
    if not torch.cuda.is_available():
        raise ConfigError(
            f"unable to load model '{model}': instance {instance.name} is KIND_GPU (GPU "
            f"{instance.gpu_id}) but PyTorch sees no CUDA device (torch {torch.__version__}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})",
            ErrorCode.UNAVAILABLE,
        )
    return torch.device("cuda", 0)


def _apply_parameters(p: TorchParameters, model: str, instance: str) -> None:
    """Set torch's process-wide knobs (this process serves one instance)."""
    torch._C._set_graph_executor_optimize(p.optimized_execution)
    torch.backends.cudnn.enabled = p.cudnn
    if p.tensor_fuser is not None:
        torch._C._jit_set_texpr_fuser_enabled(p.tensor_fuser)
    if p.jit_profiling is not None:
        torch._C._jit_set_profiling_mode(p.jit_profiling)
    if p.jit_executor is not None:
        torch._C._jit_set_profiling_executor(p.jit_executor)
    threads = p.intra_op_threads if p.intra_op_threads > 0 else None
    if threads is None:
        threads = max(1, len(os.sched_getaffinity(0)) - 1)
    torch.set_num_threads(threads)
    if p.inter_op_threads > 0:
        try:
            torch.set_num_interop_threads(p.inter_op_threads)
        except RuntimeError:  # NOTE: torch allows it once, before any parallel work
            log.warning("inter-op thread count could not be changed for '%s'", instance)
    if p.weight_sharing:
        log.warning(
            "ENABLE_WEIGHT_SHARING has no effect for model '%s': every triton-mp instance is "
            "its own process, so instances cannot share one copy of the weights",
            model,
        )
    log.info(
        "PyTorch instance '%s': optimized execution %s, inference mode %s, cuDNN %s, "
        "cache cleaning %s, %d intra-op threads",
        instance,
        "enabled" if p.optimized_execution else "disabled",
        "enabled" if p.inference_mode else "disabled",
        "enabled" if p.cudnn else "disabled",
        "enabled" if p.cache_cleaning else "disabled",
        torch.get_num_threads(),
    )


class TorchBackend:
    """Runs a TorchScript model (see the module docstring).

    Raises (from the constructor):
        ConfigError: a bad parameter, an unsupported data type, a naming mismatch, KIND_GPU
            without CUDA, or a module torch cannot load.
    """

    def __init__(self, model: ModelVersionSpec, instance: InstanceSpec) -> None:
        self._spec = model
        config = json.loads(model.config_json)
        if config.get("platform") == "torch_aoti":
            raise ConfigError(
                f"model '{model.model}': platform torch_aoti (AOTInductor model.pt2) is not "
                "supported by triton-mp yet; export TorchScript (model.pt) instead",
                ErrorCode.UNSUPPORTED,
            )
        self._params = TorchParameters.from_config(config.get("parameters", {}))
        check_datatypes(model)
        states = model.sequence.states if model.sequence is not None else ()
        controls = model.sequence.controls if model.sequence is not None else ()
        self._device = _device(instance, model.model)
        _apply_parameters(self._params, model.model, instance.name)
        with torch.inference_mode(self._params.inference_mode):
            try:
                self._module = torch.jit.load(  # type: ignore[no-untyped-call]
                    model.model_file, map_location=self._device
                )
            except Exception as e:  # noqa: BLE001 - torch raises RuntimeError and others
                raise ConfigError(
                    f"failed to load model '{model.model}': {e}", ErrorCode.INTERNAL
                ) from None
        arguments = [(a.name, a.type.kind()) for a in self._module.forward.schema.arguments]
        self._inputs: IoMap = input_map(
            model.model,
            [t.name for t in model.inputs],
            arguments,
            [s.input_name for s in states],
            [c.name for c in controls],
        )
        self._outputs: IoMap = output_map(
            model.model, [t.name for t in model.outputs], [s.output_name for s in states]
        )
        self._state_inputs = tuple(s.input_name for s in states)
        self._types = {t.name: t.datatype for t in model.outputs}
        self._types.update({s.output_name: s.datatype for s in states})
        log.info(
            "PyTorch model %s ready on %s (inputs %s, outputs %s)",
            model.model_file,
            self._device or "its saved devices",
            self._inputs.convention.value,
            self._outputs.convention.value,
        )

    # ---------------------------------------------------------------- execute
    def execute(
        self, requests: Sequence[BackendRequest], sequence: SequenceBatch | None = None
    ) -> tuple[list[Result], PhaseTimes]:
        """Run the batch once and split the outputs per request.

        Raises:
            TritonMPError: an output is missing, a scalar, or of another data type than
                the config's (INVALID_ARG), or forward() failed (INTERNAL, Triton's
                ``PyTorch execute failure: ...``).
        """
        watch = Stopwatch()
        if sequence is None:
            feeds = gather(self._spec, requests)
        else:
            feeds = gather_rows(self._spec, requests, sequence, self._state_inputs)
            feeds.update(sequence.controls)
        wanted = sorted({n for r in requests for n in r.outputs})
        with torch.inference_mode(self._params.inference_mode), torch.no_grad():
            args = self._arguments(feeds)
            t_input = watch.lap()
            try:
                returned = self._module(*args)
            except Exception as e:  # noqa: BLE001 - TorchScript raises many kinds
                raise TritonMPError(f"PyTorch execute failure: {e}", ErrorCode.INTERNAL) from None
            outputs = {n: self._host(n, self._element(returned, n)) for n in wanted}
        if self._params.cache_cleaning and self._device is not None and self._device.type == "cuda":
            torch.cuda.empty_cache()
        t_infer = watch.lap()
        starts = None if sequence is None else sequence.slots
        return scatter(self._spec, requests, outputs, starts), PhaseTimes(t_input, t_infer)

    def _arguments(self, feeds: dict[str, np.ndarray]) -> list[Any]:
        """forward()'s positional arguments (or its one dict) from the batch's inputs."""
        values = {name: self._to_torch(arr) for name, arr in feeds.items()}
        if self._inputs.dict_input:
            return [values]
        args: list[Any] = [None] * len(self._inputs.positions)
        for name, value in values.items():
            args[self._inputs.positions[name]] = value
        return args

    def _to_torch(self, arr: np.ndarray) -> Any:
        """An input as torch takes it: a tensor on the device, or ``List[str]`` for BYTES."""
        if arr.dtype == np.object_:
            return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in arr]
        tensor = torch.from_numpy(arr)
        return tensor if self._device is None else tensor.to(self._device)

    def _element(self, returned: Any, name: str) -> Any:
        """The returned value at ``name``'s position.

        Raises:
            TritonMPError: it is not there, or forward() returned a type Triton refuses.
        """
        position = self._outputs.positions[name]
        if isinstance(returned, tuple):
            if position >= len(returned):
                raise TritonMPError(f"output tensor '{name}' is not found", ErrorCode.INTERNAL)
            return returned[position]
        if isinstance(returned, torch.Tensor | list):
            if position != 0:
                raise TritonMPError(f"output tensor '{name}' is not found", ErrorCode.INTERNAL)
            return returned
        raise TritonMPError(
            "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple "
            "containing one of these two types. It should not be a List / Dictionary of "
            "Tensors or a Scalar",
            ErrorCode.INTERNAL,
        )

    def _host(self, name: str, value: Any) -> np.ndarray:
        """One output on the host, checked against its config data type.

        Raises:
            TritonMPError (INVALID_ARG): another data type, a scalar, or a list of non-str.
        """
        want = self._types.get(name, "")
        if isinstance(value, list):
            if not all(isinstance(x, str) for x in value):
                raise TritonMPError(
                    f"output '{name}' must be of type Tensor or List[str]", ErrorCode.INTERNAL
                )
            return np.array([x.encode() for x in value], dtype=np.object_)
        if not isinstance(value, torch.Tensor):
            raise TritonMPError(f"output tensor '{name}' is not found", ErrorCode.INTERNAL)
        got = _PROTOCOL_OF.get(value.dtype, str(value.dtype).removeprefix("torch."))
        if got != want:
            raise TritonMPError(
                f"configuration expects datatype {_config_name(want)} for output '{name}', "
                f"model provides TYPE_{got.upper()}",
                ErrorCode.INVALID_ARG,
            )
        if value.dim() == 0:
            raise TritonMPError(
                f"output '{name}' is a scalar which is not supported.", ErrorCode.INVALID_ARG
            )
        return value.detach().contiguous().cpu().numpy()

    def close(self) -> None:
        """Drop the module (and the CUDA cache it held)."""
        del self._module
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.empty_cache()
