"""silero_vad: Silero's voice-activity detector, one recurrent state per sequence.

A Triton python-backend model written the way a Triton user would write it, so it runs
unchanged under tritonserver too (it imports only numpy, onnxruntime and
``triton_python_backend_utils``). The model's config gives it the sequence batcher
(Oldest strategy): every request of a sequence reaches this instance, one request per
sequence per ``execute`` call as a rule, with the sequence's correlation ID and its
START / END flags.

Per request: ``AUDIO`` FP32 ``[1, 512]``, 512 samples of 16 kHz mono audio in [-1, 1]
(32 ms); answer ``PROBABILITY`` FP32 ``[1, 1]``, the probability that the chunk is speech.

The ONNX file (``silero_vad_16k_op15.onnx`` of the ``silero-vad`` wheel) takes ``input`` FP32
``[batch, 576]``, ``state`` FP32 ``[2, batch, 128]`` and ``sr`` INT64 (16000) and returns
``output`` FP32 ``[batch, 1]`` and ``stateN`` FP32 ``[2, batch, 128]``. Its 576 samples are the
last 64 samples the sequence sent before (zeros at its start) followed by the new chunk, as
Silero's own ``OnnxWrapper`` feeds it. So a sequence's state here is ``stateN`` plus those 64
samples, keyed by ``request.correlation_id()``:

- a request with ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`` starts from zeros (a START for
  a live ID restarts it);
- a request without START for an ID this instance holds no state for fails with INVALID_ARG
  (it never silently starts from zeros);
- after a request with ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_END`` the state is dropped;
- a sequence the batcher released as idle (no END) is never announced to a python model, so
  states unused for ``max_sequence_idle_microseconds`` plus a minute are dropped here too; the
  batcher refuses that ID's next request without START long before then.

The requests of one ``execute`` call run as ONE onnxruntime call: their chunks are stacked
along the batch axis and their states along axis 1 of ``state``. Should a call hold two
requests of one sequence, they run in order, in successive onnxruntime calls.
"""

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

SAMPLE_RATE_HZ = 16000
"""The only sample rate of the 16 kHz model."""
CHUNK_SAMPLES = 512
"""Samples per request (32 ms)."""
CONTEXT_SAMPLES = 64
"""Samples of the previous chunk prepended to each chunk."""
STATE_SHAPE = (2, 128)
"""One sequence's recurrent state: ``stateN[:, row, :]``."""
FORGET_MARGIN_S = 60.0
"""How long past ``max_sequence_idle_microseconds`` an unused state is kept."""


class SequenceState:
    """What one sequence carries from one chunk to the next."""

    __slots__ = ("context", "last_used_s", "state")

    def __init__(self) -> None:
        self.state = np.zeros(STATE_SHAPE, np.float32)
        """The model's recurrent state, ``[2, 128]`` FP32."""
        self.context = np.zeros(CONTEXT_SAMPLES, np.float32)
        """The last 64 samples the sequence sent, ``[64]`` FP32."""
        self.last_used_s = 0.0
        """``time.monotonic()`` of its last request."""


class TritonPythonModel:
    """Triton python model: one onnxruntime session, a ``SequenceState`` per correlation ID."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {
            key: value.get("string_value", "")
            for key, value in config.get("parameters", {}).items()
        }
        onnx_file = Path(args["model_repository"]) / args["model_version"]
        onnx_file = onnx_file / parameters.get("onnx_file", "silero_vad.onnx")
        if not onnx_file.is_file():
            raise pb_utils.TritonModelException(
                f"{onnx_file} is missing: it comes from the silero-vad wheel "
                "(pip install --no-deps silero-vad==6.2.3; triton-mp start copies "
                "silero_vad/data/silero_vad_16k_op15.onnx there when it serves the default "
                "repository)"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(parameters.get("intra_op_thread_count", "1"))
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(onnx_file), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.sample_rate = np.array(SAMPLE_RATE_HZ, np.int64)
        # NOTE: protobuf's JSON form writes 64-bit integers as strings.
        sequence_batching = config.get("sequence_batching", {})
        idle_us = int(sequence_batching.get("max_sequence_idle_microseconds", 1_000_000))
        self.forget_after_s = idle_us / 1e6 + FORGET_MARGIN_S
        self.sequences = {}
        self.clock = time.monotonic
        pb_utils.Logger.log_info(
            f"silero_vad {args['model_instance_name']}: {onnx_file}, "
            f"{options.intra_op_num_threads} onnxruntime thread(s)"
        )

    def execute(self, requests):
        now_s = self.clock()
        self._forget_unused(now_s)
        responses = [None] * len(requests)
        pending = list(range(len(requests)))
        while pending:
            # NOTE: at most one request per sequence per onnxruntime call; once an ID is
            # deferred, its later requests are too, so each sequence keeps its order.
            wave, deferred, seen = [], [], set()
            for i in pending:
                corrid = requests[i].correlation_id()
                (deferred if corrid in seen else wave).append(i)
                seen.add(corrid)
            self._run(requests, wave, responses, now_s)
            pending = deferred
        return responses

    def finalize(self):
        self.sequences.clear()

    def _run(self, requests, indices, responses, now_s):
        """Answer ``requests[i]`` for ``i`` in ``indices`` (distinct sequences) in one call."""
        rows = []  # (request index, correlation ID, state, chunk)
        for i in indices:
            request = requests[i]
            corrid = request.correlation_id()
            flags = request.flags()
            error = None
            audio = pb_utils.get_input_tensor_by_name(request, "AUDIO")
            chunk = None if audio is None else audio.as_numpy()
            if corrid in (0, ""):
                error = (
                    "silero_vad needs a sequence: send every request with a sequence_id, "
                    "sequence_start on the first"
                )
            elif chunk is None or chunk.shape != (1, CHUNK_SAMPLES):
                shape = None if chunk is None else list(chunk.shape)
                error = f"AUDIO must have shape [1, {CHUNK_SAMPLES}], got {shape}"
            elif flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                rows.append((i, corrid, SequenceState(), chunk))
            elif corrid in self.sequences:
                rows.append((i, corrid, self.sequences[corrid], chunk))
            else:
                error = (
                    f"sequence {corrid} has no state in this instance: its first request "
                    "must carry the START flag"
                )
            if error is not None:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)
                )
                if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                    self.sequences.pop(corrid, None)
        if not rows:
            return
        chunks = np.concatenate([chunk for _, _, _, chunk in rows]).astype(np.float32)
        contexts = np.stack([state.context for _, _, state, _ in rows])
        frames = np.concatenate([contexts, chunks], axis=1)  # [n, 576]
        states = np.stack([state.state for _, _, state, _ in rows], axis=1)  # [2, n, 128]
        probabilities, next_states = self.session.run(
            ["output", "stateN"],
            {"input": frames, "state": states, "sr": self.sample_rate},
        )
        # NOTE: states change only after the call succeeded; if it raises, every request of
        # the call fails and every sequence keeps the state it had.
        for row, (i, corrid, state, _) in enumerate(rows):
            state.state = np.ascontiguousarray(next_states[:, row, :])
            state.context = frames[row, -CONTEXT_SAMPLES:].copy()
            state.last_used_s = now_s
            if requests[i].flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sequences.pop(corrid, None)
            else:
                self.sequences[corrid] = state
            output = pb_utils.Tensor(
                "PROBABILITY", probabilities[row : row + 1].astype(np.float32, copy=False)
            )
            responses[i] = pb_utils.InferenceResponse(output_tensors=[output])

    def _forget_unused(self, now_s):
        """Drop states unused for longer than the batcher's idle time plus a margin."""
        stale = [
            corrid
            for corrid, state in self.sequences.items()
            if now_s - state.last_used_s > self.forget_after_s
        ]
        for corrid in stale:
            del self.sequences[corrid]
        if stale:
            pb_utils.Logger.log_verbose(f"silero_vad: dropped {len(stale)} unused sequence(s)")
