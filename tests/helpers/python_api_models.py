"""Python models shared by the python-backend API e2e tests (not a test module).

Each ``*_CONFIG`` / ``*_MODEL`` pair is one model's config.pbtxt and ``1/model.py`` (written
with ``tests.conftest.write_python_model``); the docstring under each model says what it does.
``write_api_models(repo)`` writes the set ``tests/e2e/test_python_api.py`` serves.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.repos import write_python_model

PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
PARAMS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

BAD = {1: {"ratio": 1.5}, 2: {3: "three"}, 3: {"items": [1]}}
BIG = {4: 2**63, 5: -(2**63) - 1, 6: 2**64, 7: 2**63 - 1, 8: -(2**63)}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            out = [pb_utils.Tensor("OUT", np.array([mode], np.int32))]
            if mode in BAD:
                try:
                    pb_utils.InferenceResponse(out, parameters=BAD[mode])
                    text = "accepted"
                except Exception as e:
                    text = str(e)
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(text, pb_utils.TritonError.INVALID_ARG)))
                continue
            if mode in BIG:
                responses.append(pb_utils.InferenceResponse(out, parameters={"big": BIG[mode]}))
                continue
            params = {"flag": True, "count": 7 + mode, "name": "ok", "off": False}
            responses.append(pb_utils.InferenceResponse(out, parameters=params))
        return responses
"""
"""MODE 0: a response with one parameter of each type; 1-3: the message upstream's
constructor raises for a float value, an int key, a list value; 4-8: a parameter ``big``
just outside int64 (2**63, -2**63 - 1, 2**64: the constructor takes them, the send refuses
them) and at its ends (2**63 - 1, -2**63: sent)."""

PARAMS_DEC_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
PARAMS_DEC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], np.int32))],
                    parameters={"index": i, "last": i == n - 1}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

BLS_PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BLS_PARAMS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE")
            answer = pb_utils.InferenceRequest(
                model_name="params_py", requested_output_names=["OUT"], inputs=[mode]
            ).exec()
            seen = json.loads(answer.parameters())
            text = json.dumps(seen, sort_keys=True).encode()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PARAMS", np.array([text], np.object_))]))
        return responses
"""
"""Calls ``params_py`` through BLS and returns the parameters of its response."""

CANCEL_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
CANCEL_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = os.path.join(args["model_repository"], "seen")
        os.makedirs(self.seen, exist_ok=True)

    def execute(self, requests):
        responses = []
        for request in requests:
            ms = int(pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()[0])
            deadline = time.monotonic() + ms / 1000
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.01)
            if request.is_cancelled():
                open(os.path.join(self.seen, request.request_id()), "w").close()
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled by the client", pb_utils.TritonError.CANCELLED)))
            else:
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([ms], np.int32))]))
        return responses
"""
"""Runs MS milliseconds inside ``execute`` unless ``request.is_cancelled()`` turns true; then
it leaves a file named after the request id in ``<model dir>/seen``."""

TICKER_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
TICKER_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = os.path.join(args["model_repository"], "seen")
        os.makedirs(self.seen, exist_ok=True)

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                if sender.is_cancelled():
                    name = request.request_id() + ("-request" if request.is_cancelled() else "")
                    open(os.path.join(self.seen, name), "w").close()
                    break
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], np.int32))]))
                time.sleep(0.02)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
"""Decoupled: sends N responses 20 ms apart from inside ``execute`` until its
``response_sender.is_cancelled()``; then leaves ``seen/<request id>`` (``-request`` appended
when ``request.is_cancelled()`` agrees) and ends the request."""

BLS_CANCEL_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BLS_CANCEL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            call = pb_utils.InferenceRequest(
                model_name="ticker_py", requested_output_names=["OUT"], inputs=[n],
                request_id=request.request_id())
            count = 0
            iterator = call.exec(decoupled=True)
            for answer in iterator:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                if answer.output_tensors():
                    count += 1
                if count == 2:
                    iterator.cancel()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
"""
"""Calls the decoupled ``ticker_py`` through BLS, cancels after two responses, and counts
the responses the iterator gave until it ended."""

READY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
READY_MODEL = """
import asyncio
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def _flag(self, name):
        return os.path.exists(os.path.join(self.dir, name))

    def is_ready(self):
        with open(os.path.join(self.dir, "calls"), "a") as f:
            f.write("x")
        if self._flag("raise"):
            raise RuntimeError("the feature store is down")
        if self._flag("slow"):
            time.sleep(7)
        if self._flag("number"):
            return 1
        return not self._flag("not_ready")

    def execute(self, requests):
        responses = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(int(ms[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return responses
"""
"""``is_ready()`` counts its calls in ``<model dir>/calls`` and answers by flag files:
``not_ready`` False, ``raise`` raises, ``slow`` takes 7 s, ``number`` returns 1."""
READY_ASYNC_MODEL = READY_MODEL.replace("def is_ready(self):", "async def is_ready(self):")


# ---------------------------------------------------------------- response sender checks
SENDER_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
SENDER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def text(value):
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("TEXT", np.array([value.encode()], np.object_))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            seen = []
            for flags, response in ((2, text("x")), (3, None), (0, None)):
                try:
                    sender.send(response, flags=flags)
                    seen.append("sent")
                except pb_utils.TritonModelException as e:
                    seen.append(str(e))
            sender.send(text(" | ".join(seen)), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(text("late"))
            except pb_utils.TritonModelException as e:
                pb_utils.Logger.log_info("after final: " + str(e))
        return None
"""
"""Decoupled: sends with flags 2, 3 and 0-without-response, and answers what each raised;
then a send after the final one (its message is logged)."""


OMIT_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""
OMIT_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("A", x * 2)]))
        return out
"""
"""Answers A only, though B is a declared output."""

API_MODELS: dict[str, tuple[str, str]] = {
    "params_py": (PARAMS_CONFIG, PARAMS_MODEL),
    "params_dec_py": (PARAMS_DEC_CONFIG, PARAMS_DEC_MODEL),
    "bls_params_py": (BLS_PARAMS_CONFIG, BLS_PARAMS_MODEL),
    "cancel_py": (CANCEL_CONFIG, CANCEL_MODEL),
    "ticker_py": (TICKER_CONFIG, TICKER_MODEL),
    "bls_cancel_py": (BLS_CANCEL_CONFIG, BLS_CANCEL_MODEL),
    "ready_py": (READY_CONFIG, READY_MODEL),
    "ready_async_py": (READY_CONFIG, READY_ASYNC_MODEL),
    "sender_py": (SENDER_CONFIG, SENDER_MODEL),
    "omit_py": (OMIT_CONFIG, OMIT_MODEL),
}
"""The models of ``test_python_api``: name -> (config, source)."""


def write_api_models(repo: Path, models: dict[str, tuple[str, str]] = API_MODELS) -> Path:
    """Write ``models`` (name -> (config, source)) into ``repo``; returns ``repo``."""
    for name, (config, source) in models.items():
        write_python_model(repo, name, config, source)
    return repo


# ---------------------------------------------------------------- request rescheduling
ITER_CONFIG = """
backend: "python"
max_batch_size: 0
sequence_batching { iterative_sequence: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ITER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            cid = request.correlation_id()
            flags = self.seen.setdefault(cid, [])
            flags.append(request.flags())
            if len(flags) < n:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            del self.seen[cid]
            out = np.array(flags + [1 if cid else 0], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
"""Iterative, not decoupled (python_backend README "Request Rescheduling"): runs a request
IN times, rescheduling it (response None) until then; answers the request flags each
execution saw, then 1 when the request had a correlation ID."""

ITER_DEC_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
sequence_batching { iterative_sequence: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ITER_DEC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            cid = request.correlation_id()
            left = self.left.get(cid, n) - 1
            sender = request.get_response_sender()
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
            if left <= 0:
                self.left.pop(cid, None)
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.left[cid] = left
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
        return None
"""
"""Iterative and decoupled (the README's example): one response per execution with the
number of responses left, rescheduled until none is left (then final)."""

RESCHED_PLAIN_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
"""``ITER_MODEL`` without ``iterative_sequence`` (no sequence batching at all)."""

RESCHEDULE_MODELS: dict[str, tuple[str, str]] = {
    "iter_py": (ITER_CONFIG, ITER_MODEL),
    "iter_dec_py": (ITER_DEC_CONFIG, ITER_DEC_MODEL),
    "resched_plain_py": (RESCHED_PLAIN_CONFIG, ITER_MODEL),
}
"""The models of ``test_python_reschedule``."""


# ---------------------------------------------------------------- BLS with stateful models
ACC_CONFIG = """
backend: "python"
max_batch_size: 0
sequence_batching { max_sequence_idle_microseconds: 5000000 }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ACC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            cid = request.correlation_id()
            flags = request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[cid] = 0
            self.sums[cid] = self.sums.get(cid, 0) + x
            out = np.array([self.sums[cid], cid, flags], np.int32)
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[cid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", out)]))
        return responses
"""
"""A sequence model: the running sum of X per correlation ID, with the ID and the flags."""

BLS_SEQ_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 3 ] } ]
output [ { name: "SUMS" data_type: TYPE_INT32 dims: [ 3, 3 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BLS_SEQ_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            xs = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            rows = []
            for i, flags in enumerate((START, 0, END)):
                answer = pb_utils.InferenceRequest(
                    model_name="acc_py", requested_output_names=["SUM"],
                    inputs=[pb_utils.Tensor("X", xs[i:i + 1])],
                    request_id=str(i), correlation_id=4, flags=flags,
                ).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                rows.append(pb_utils.get_output_tensor_by_name(answer, "SUM").as_numpy())
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SUMS", np.stack(rows).astype(np.int32))]))
        return responses
"""
"""The README's "Using BLS with Stateful Models": one sequence (correlation ID 4) of three
requests to ``acc_py`` with START, no flag, END."""

STATEFUL_BLS_MODELS: dict[str, tuple[str, str]] = {
    "acc_py": (ACC_CONFIG, ACC_MODEL),
    "bls_seq_py": (BLS_SEQ_CONFIG, BLS_SEQ_MODEL),
}


# ---------------------------------------------------------------- default-mode response sender
DEFAULT_SENDER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
DEFAULT_SENDER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def text(value):
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("TEXT", np.array([value.encode()], np.object_))])


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                sender.send(text("sent"), flags=FINAL)
                out.append(None)
            elif mode == 1:
                sender.send(text("sent"))
                out.append(text("returned too"))
            else:
                try:
                    sender.send(flags=FINAL)
                    seen = "sent"
                except pb_utils.TritonModelException as e:
                    seen = str(e)
                out.append(text(seen))
        return None if all(r is None for r in out) else out
"""
"""A default-mode model answering through the response sender (upstream since 24.07): MODE
0 sends its one response there (execute returns None), 1 sends one and returns one too,
2 sends the final flag alone first (and answers what that raised)."""

DEFAULT_SENDER_MODELS: dict[str, tuple[str, str]] = {
    "default_sender_py": (DEFAULT_SENDER_CONFIG, DEFAULT_SENDER_MODEL),
}
