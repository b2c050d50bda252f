"""``triton_python_backend_utils`` as user models use it (no processes, no server)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from triton_mp.backends.python import pb_utils
from triton_mp.common.errors import ErrorCode


def test_constants_have_tritons_values() -> None:
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2


def test_error_codes_are_tritonserver_error_codes() -> None:
    E = pb_utils.TritonError
    names = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED"]
    names += ["ALREADY_EXISTS", "CANCELLED"]
    for name in names:
        assert getattr(E, name) == ErrorCode[name], name
    err = E("boom")
    assert (err.message(), err.code()) == ("boom", E.INTERNAL)
    assert E("gone", E.NOT_FOUND).code() == 2


def test_triton_model_exception_is_an_exception() -> None:
    with pytest.raises(pb_utils.TritonModelException) as e:
        raise pb_utils.TritonModelException("bad input")
    assert str(e.value) == "bad input"
    assert e.value.message() == "bad input"


def test_request_as_a_model_receives_it() -> None:
    a = pb_utils.Tensor("INPUT0", np.ones(3, np.float32))
    b = pb_utils.Tensor("INPUT1", np.zeros(3, np.float32))
    req = pb_utils.InferenceRequest(
        model_name="m",
        requested_output_names=["OUTPUT0"],
        inputs=[a, b],
        request_id="r1",
        correlation_id=42,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        parameters={"temperature": 1, "mode": "fast", "ok": True},
    )
    assert req.inputs() == [a, b]
    assert req.requested_output_names() == {"OUTPUT0"}
    assert req.request_id() == "r1"
    assert req.correlation_id() == 42
    assert req.flags() == 1
    assert json.loads(req.parameters()) == {"temperature": 1, "mode": "fast", "ok": True}
    assert pb_utils.get_input_tensor_by_name(req, "INPUT1") is b
    assert req.get_input_tensor_by_name("INPUT0") is a
    assert pb_utils.get_input_tensor_by_name(req, "NOPE") is None
    assert not req.is_cancelled()
    assert pb_utils.InferenceRequest().parameters() == "{}"


def test_request_features_outside_a_server_fail_clearly() -> None:
    req = pb_utils.InferenceRequest(model_name="other")
    answer = req.exec()  # BLS needs the worker's client: an error response, as in Triton
    assert answer.has_error()
    assert "BLS is only available inside a model served by triton-mp" in answer.error().message()
    with pytest.raises(pb_utils.TritonModelException, match="requests a model.s execute"):
        req.get_response_sender()


def test_response_outputs_and_errors() -> None:
    out = pb_utils.Tensor("OUTPUT0", np.ones(2))
    ok = pb_utils.InferenceResponse(output_tensors=[out])
    assert ok.output_tensors() == [out]
    assert not ok.has_error()
    assert ok.error() is None
    assert pb_utils.get_output_tensor_by_name(ok, "OUTPUT0") is out
    assert pb_utils.get_output_tensor_by_name(ok, "OUTPUT1") is None
    bad = pb_utils.InferenceResponse(
        error=pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    )
    assert bad.has_error()
    error = bad.error()
    assert error is not None
    assert error.code() == pb_utils.TritonError.NOT_FOUND
    assert bad.output_tensors() == []


CONFIG = {
    "name": "m",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]}],
}


def test_config_helpers() -> None:
    assert pb_utils.get_input_config_by_name(CONFIG, "INPUT0") == CONFIG["input"][0]  # type: ignore[index]
    assert pb_utils.get_input_config_by_name(CONFIG, "X") is None
    out = pb_utils.get_output_config_by_name(CONFIG, "OUTPUT0")
    assert out is not None
    assert pb_utils.triton_string_to_numpy(out["data_type"]) is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is np.bool_
    assert not pb_utils.using_decoupled_model_transaction_policy(CONFIG)
    decoupled = {**CONFIG, "model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(decoupled)


def test_numpy_and_triton_types() -> None:
    assert pb_utils.numpy_to_triton_type(np.float32) == pb_utils.TRITONSERVER_TYPE_FP32
    assert pb_utils.numpy_to_triton_type(np.object_) == pb_utils.TRITONSERVER_TYPE_BYTES
    assert pb_utils.numpy_to_triton_type(np.bytes_) == pb_utils.TRITONSERVER_TYPE_BYTES
    assert pb_utils.triton_to_numpy_type(pb_utils.TRITONSERVER_TYPE_INT64) is np.int64
    assert pb_utils.triton_to_numpy_type(pb_utils.TRITONSERVER_TYPE_BF16) is None
    for code in range(1, 14):
        np_type = pb_utils.triton_to_numpy_type(code)
        assert pb_utils.numpy_to_triton_type(np_type) == code


def test_bytes_serialisation_round_trip() -> None:
    arr = np.array([b"ab", b"", b"\x00\xff"], dtype=np.object_)
    flat = pb_utils.serialize_byte_tensor(arr)
    assert flat is not None
    assert flat.dtype == np.uint8
    assert flat.tobytes() == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\x00\xff"
    back = pb_utils.deserialize_bytes_tensor(flat.tobytes())
    assert list(back) == list(arr)
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) is None


def test_logger_goes_to_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="triton_mp.model"):
        pb_utils.Logger.log_info("i")
        pb_utils.Logger.log_warn("w")
        pb_utils.Logger.log_error("e")
        pb_utils.Logger.log_verbose("v")
        pb_utils.Logger().log("x", pb_utils.LogLevel.ERROR)
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        (logging.INFO, "i"),
        (logging.WARNING, "w"),
        (logging.ERROR, "e"),
        (logging.DEBUG, "v"),
        (logging.ERROR, "x"),
    ]


def test_response_sender_rules() -> None:
    posted: list[tuple[object, bool]] = []
    cancelled = [False]
    sender = pb_utils.InferenceResponseSender(
        lambda resp, final: posted.append((resp, final)), lambda: cancelled[0]
    )
    with pytest.raises(pb_utils.TritonModelException, match="Inference Response object must be"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag provided"):
        sender.send(flags=3)
    with pytest.raises(pb_utils.TritonModelException, match="InferenceResponse"):
        sender.send("not a response", flags=0)  # type: ignore[arg-type]
    resp = pb_utils.InferenceResponse([])
    sender.send(resp)
    assert not sender.is_cancelled()
    cancelled[0] = True
    assert sender.is_cancelled()
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert posted == [(resp, False), (None, True)]
    with pytest.raises(pb_utils.TritonModelException) as e:
        sender.send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert e.value.message() == "Unable to send response. Response sender has been closed."
    assert len(posted) == 2


def test_a_default_mode_sender_sends_one_response_and_no_final_before_it() -> None:
    """response_sender.cc UpdateStateAndCounters for a non-decoupled model."""
    posted: list[tuple[object, bool]] = []
    sender = pb_utils.InferenceResponseSender(
        lambda resp, final: posted.append((resp, final)), lambda: False, decoupled=False
    )
    with pytest.raises(pb_utils.TritonModelException) as e:
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert e.value.message() == (
        "Unable to send response. Non-decoupled model cannot send complete final before "
        "sending a response."
    )
    resp = pb_utils.InferenceResponse([])
    sender.send(resp)
    with pytest.raises(pb_utils.TritonModelException) as e:
        sender.send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert e.value.message() == (
        "Unable to send response. Non-decoupled model cannot send more than one response."
    )
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert posted == [(resp, False), (None, True)]


def test_response_sender_is_only_for_decoupled_requests() -> None:
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException) as e:
        request.get_response_sender()
    assert e.value.code() == pb_utils.TritonError.UNSUPPORTED
    assert request.is_cancelled() is False


def test_bls_exec_and_async_exec_go_through_the_installed_client() -> None:
    import asyncio

    calls: list[tuple[str, bool]] = []

    def submit(request: pb_utils.InferenceRequest, decoupled: bool, answer):  # type: ignore[no-untyped-def]
        calls.append((request.model_name(), decoupled))
        out = pb_utils.Tensor("OUT", np.array([len(calls)]))
        if decoupled:
            threading.Thread(
                target=lambda: [
                    answer(pb_utils.InferenceResponse([out]), False),
                    answer(pb_utils.InferenceResponse([]), True),
                ]
            ).start()
        else:
            threading.Thread(target=answer, args=(pb_utils.InferenceResponse([out]), True)).start()
        return lambda: None

    pb_utils.set_bls(submit)
    try:
        req = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
        first = req.exec()
        assert pb_utils.get_output_tensor_by_name(first, "OUT").as_numpy()[0] == 1
        second = asyncio.run(req.async_exec())
        assert pb_utils.get_output_tensor_by_name(second, "OUT").as_numpy()[0] == 2
        stream = list(req.exec(decoupled=True))
        assert [len(r.output_tensors()) for r in stream] == [1, 0]
        assert calls == [("m", False), ("m", False), ("m", True)]
    finally:
        pb_utils.set_bls(None)


def test_a_bls_request_past_its_timeout_is_cancelled_and_answered_with_an_error() -> None:
    import asyncio

    cancelled: list[bool] = []

    def submit(request: pb_utils.InferenceRequest, decoupled: bool, answer):  # type: ignore[no-untyped-def]
        return lambda: cancelled.append(decoupled)  # NOTE: the callee never answers

    pb_utils.set_bls(submit)
    try:
        req = pb_utils.InferenceRequest(model_name="m", timeout=2000)
        expected = "BLS request to model 'm' got no response within its timeout of 2000 us"
        for response in (req.exec(), asyncio.run(req.async_exec())):
            assert response.has_error()
            assert response.error().message() == expected
            assert response.error().code() == ErrorCode.DEADLINE_EXCEEDED
        (stream,) = list(req.exec(decoupled=True))
        assert (
            stream.error().message()
            == "BLS request to model 'm' got no response within its timeout"
        )
        assert cancelled == [False, False, True]
    finally:
        pb_utils.set_bls(None)


def test_string_arguments_may_be_bytes_as_pybind_takes_them() -> None:
    """Triton's BLS example passes ``MODEL_NAME.as_numpy()[0]`` (bytes) as the model name;
    pybind turns bytes into ``std::string`` for every string argument, so they are decoded."""
    name = np.array([b"add_sub"], dtype=np.object_)[0]
    req = pb_utils.InferenceRequest(
        model_name=name,
        requested_output_names=[b"OUTPUT0", "OUTPUT1", np.bytes_(b"OUTPUT2")],
        inputs=[],
        request_id=b"r1",
    )
    assert req.model_name() == "add_sub"
    assert req.requested_output_names() == {"OUTPUT0", "OUTPUT1", "OUTPUT2"}
    assert req.request_id() == "r1"
    assert pb_utils.Tensor(b"T", np.zeros(1)).name() == "T"
    assert pb_utils.TritonError(b"bad").message() == "bad"
    # Not UTF-8: the name matches no model (as the raw bytes would not in Triton).
    assert pb_utils.InferenceRequest(model_name=b"\xff", inputs=[]).model_name() == "\ufffd"


def test_requested_output_names_must_be_a_list_not_one_string() -> None:
    with pytest.raises(TypeError, match="list of strings"):
        pb_utils.InferenceRequest(model_name="m", requested_output_names="OUTPUT0", inputs=[])


def test_constants_come_from_the_one_definition_of_each() -> None:
    """Request flags are ``SequenceFlags``', error codes ``ErrorCode``'s, datatypes
    ``DataType``'s: plain ints (flags, types) or the enum members themselves (codes)."""
    from triton_mp.common.datatypes import DataType
    from triton_mp.ipc.protocol.messages import SequenceFlags

    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == SequenceFlags.START
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == SequenceFlags.END
    assert type(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) is int
    both = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | (
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    )
    assert both == SequenceFlags.START | SequenceFlags.END
    for name in ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE"):
        assert getattr(pb_utils.TritonError, name) is ErrorCode[name]
    for t in DataType:
        name = "BYTES" if t is DataType.STRING else t.name
        assert getattr(pb_utils, f"TRITONSERVER_TYPE_{name}") == t.value
        if t.numpy is not None:
            assert pb_utils.triton_to_numpy_type(t.value) is t.numpy.type
            assert pb_utils.TRITON_STRING_TO_NUMPY[t.config_name] is t.numpy.type
    assert "TYPE_BF16" not in pb_utils.TRITON_STRING_TO_NUMPY


def test_the_add_sub_example_calls() -> None:
    """Triton's add_sub example: output configs, their numpy types, tensors and responses."""
    config = {
        "output": [
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [4]},
        ]
    }
    out0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
    out1 = pb_utils.get_output_config_by_name(config, "OUTPUT1")
    assert out0 is not None
    assert out1 is not None
    dtype0 = pb_utils.triton_string_to_numpy(out0["data_type"])
    dtype1 = pb_utils.triton_string_to_numpy(out1["data_type"])
    a = pb_utils.Tensor("INPUT0", np.arange(4, dtype=np.float32))
    b = pb_utils.Tensor("INPUT1", np.ones(4, dtype=np.float32))
    request = pb_utils.InferenceRequest(model_name="add_sub", inputs=[a, b])
    in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
    in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
    assert in0 is not None
    assert in1 is not None
    response = pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("OUTPUT0", (in0.as_numpy() + in1.as_numpy()).astype(dtype0)),
            pb_utils.Tensor("OUTPUT1", (in0.as_numpy() - in1.as_numpy()).astype(dtype1)),
        ]
    )
    assert [t.triton_dtype() for t in response.output_tensors()] == [
        pb_utils.TRITONSERVER_TYPE_FP32,
        pb_utils.TRITONSERVER_TYPE_INT32,
    ]


def test_logger_levels_are_attributes_of_the_logger_as_in_triton(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = pb_utils.Logger
    with caplog.at_level(logging.DEBUG, logger="triton_mp.model"):
        logger.log("Specific Msg!", logger.INFO)
        logger.log("warned", logger.WARNING)
        logger.log("failed", pb_utils.Logger.LogLevel.ERROR)
        logger.log("verbose", logger.VERBOSE)
        logger.log_info(b"bytes too")
        logger.log("default level")
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        (logging.INFO, "Specific Msg!"),
        (logging.WARNING, "warned"),
        (logging.ERROR, "failed"),
        (logging.DEBUG, "verbose"),
        (logging.INFO, "bytes too"),
        (logging.INFO, "default level"),
    ]


def test_bls_request_options_of_tritons_examples_are_accepted() -> None:
    """``preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_CPU, preferred_device_id=0)``,
    ``trace=request.trace()`` (whose context is None: triton-mp does not trace), sequence
    flags and parameters, as Triton's BLS documentation writes them."""
    incoming = pb_utils.InferenceRequest(model_name="m", inputs=[])
    assert incoming.trace().get_context() is None
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, preferred_device_id=0)
    assert (memory.preferred_memory_type, memory.preferred_device_id) == (
        pb_utils.TRITONSERVER_MEMORY_CPU,
        0,
    )
    request = pb_utils.InferenceRequest(
        model_name="model_name",
        requested_output_names=["REQUESTED_OUTPUT_1"],
        inputs=[pb_utils.Tensor("IN", np.zeros(1))],
        request_id="1",
        correlation_id=4,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        preferred_memory=memory,
        trace=incoming.trace(),
        parameters={"key": "value"},
    )
    assert request.flags() == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert json.loads(request.parameters()) == {"key": "value"}


def test_model_loading_api() -> None:
    """``is_model_ready`` answers from the worker's BLS table; ``load_model`` and
    ``unload_model`` outside a served model (no model control installed) say so."""
    asked: list[tuple[str, int]] = []

    def ready(name: str, version: int) -> bool:
        asked.append((name, version))
        return name == "onnx_model"

    with pytest.raises(pb_utils.TritonModelException, match="only available inside a model"):
        pb_utils.is_model_ready("onnx_model")
    pb_utils.set_bls(lambda *a: None, ready)
    try:
        assert pb_utils.is_model_ready(model_name="onnx_model", model_version="1")
        assert not pb_utils.is_model_ready(b"other")
        assert asked == [("onnx_model", 1), ("other", -1)]
        with pytest.raises(pb_utils.TritonModelException, match="integral value > 0"):
            pb_utils.is_model_ready("onnx_model", "latest")
    finally:
        pb_utils.set_bls(None)
    for call in (
        lambda: pb_utils.load_model(model_name="onnx_model", config="{}"),
        lambda: pb_utils.unload_model(model_name="onnx_model", unload_dependents=True),
    ):
        with pytest.raises(pb_utils.TritonModelException, match="only available inside") as e:
            call()
        assert e.value.code() == ErrorCode.UNSUPPORTED


def test_get_model_dir_is_the_model_files_directory(tmp_path: Path) -> None:
    from triton_mp.backends.python.model_module import import_model_module, install_pb_utils

    model_file = tmp_path / "m" / "1" / "model.py"
    model_file.parent.mkdir(parents=True)
    model_file.write_text(
        "import triton_python_backend_utils as pb_utils\nmodel_dir = pb_utils.get_model_dir()\n"
    )
    install_pb_utils()
    module = import_model_module(model_file, "m")
    version_dir = str(model_file.parent.resolve())
    assert module.model_dir == version_dir
    assert pb_utils.get_model_dir() == version_dir


def test_parameters_are_checked_as_upstream_checks_them() -> None:
    """pb_stub.cc PyParametersToJSON: str keys, bool/int/str values, upstream's words."""
    ok = pb_utils.InferenceResponse([], parameters={"a": True, "b": 3, "c": "x"})
    assert json.loads(ok.parameters()) == {"a": True, "b": 3, "c": "x"}
    assert pb_utils.InferenceResponse([]).parameters() == "{}"
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils.InferenceResponse([], parameters={"r": 0.5})
    assert e.value.message() == (
        "Expect parameters values to have type bool/int/str, found type <class 'float'>"
    )
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils.InferenceRequest(model_name="m", parameters={1: "one"})
    assert e.value.message() == "Expect parameters keys to have type str, found type <class 'int'>"


def test_the_backends_request_is_the_constructors_for_the_same_arguments() -> None:
    """``_backend_request`` and ``_input_tensor`` (the python backend's hot path) make what
    the public constructors make of already-converted arguments."""
    a = np.arange(4, dtype=np.float32)
    args = ("m", ["OUT"], "rid", 7, 3, 1, 250, '{"k": 1}')
    fast = pb_utils._backend_request(args[0], args[1], [pb_utils._input_tensor("IN", a)], *args[2:])
    slow = pb_utils.InferenceRequest(
        model_name="m",
        requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("IN", a)],
        request_id="rid",
        correlation_id=7,
        model_version=3,
        flags=1,
        timeout=250,
        parameters='{"k": 1}',
    )
    for slot in pb_utils.InferenceRequest.__slots__:
        if slot == "_inputs":
            continue
        assert getattr(fast, slot) == getattr(slow, slot), slot
    (t,) = fast.inputs()
    assert fast.get_input_tensor_by_name("IN") is t
    assert t.name() == "IN"
    assert t.as_numpy() is a
    assert fast.requested_output_names() == {"OUT"}
    assert fast.parameters() == '{"k": 1}'


def test_get_input_tensor_by_name_asks_a_request_of_another_class() -> None:
    """pb_utils' own requests are searched in place; another class's method is called."""
    a = pb_utils.Tensor("A", np.zeros(2, np.float32))
    req = pb_utils.InferenceRequest(inputs=[a], requested_output_names=[])
    assert pb_utils.get_input_tensor_by_name(req, "A") is a
    assert pb_utils.get_input_tensor_by_name(req, "B") is None

    class Renaming(pb_utils.InferenceRequest):
        __slots__ = ()

        def get_input_tensor_by_name(self, name: str) -> pb_utils.Tensor | None:
            return super().get_input_tensor_by_name(name.upper())

    sub = Renaming(inputs=[a], requested_output_names=[])
    assert pb_utils.get_input_tensor_by_name(sub, "a") is a


def test_a_request_built_by_a_model_has_no_sender_and_is_never_cancelled() -> None:
    req = pb_utils.InferenceRequest(model_name="m", requested_output_names=[])
    assert req.is_cancelled() is False
    with pytest.raises(pb_utils.TritonModelException, match="only available"):
        req.get_response_sender()
