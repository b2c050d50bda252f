"""Model control from python models, without processes: the supervisor's checks of a call
(``supervisor.models.bls_control.check_call``) and pb_utils' argument checks and wording."""

from __future__ import annotations

import pytest

from triton_mp.backends.python import pb_utils
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.protocol.control_messages import ModelLoadCall, ModelUnloadCall
from triton_mp.supervisor.models.bls_control import check_call


def test_only_explicit_mode_takes_calls() -> None:
    for mode in ("none", "poll"):
        for call in (ModelLoadCall(call_id=1, model="m"), ModelUnloadCall(call_id=2, model="m")):
            with pytest.raises(TritonMPError) as e:
                check_call(call, mode)
            assert e.value.code == ErrorCode.UNAVAILABLE
            assert e.value.message == (
                "explicit model load / unload is not allowed if polling is enabled"
            )


def test_a_load_is_checked_as_the_client_apis() -> None:
    call = ModelLoadCall(call_id=1, model="m", config_json="{}", files={"file:1/model.py": b"x"})
    assert check_call(call, "explicit").files == {"1/model.py": b"x"}
    with pytest.raises(TritonMPError) as e:
        check_call(ModelLoadCall(call_id=1, model="m", files={"model.py": b"x"}), "explicit")
    assert e.value.message == "Unrecognized load parameter 'model.py' with type 'BYTES'"
    with pytest.raises(TritonMPError) as e:
        check_call(ModelLoadCall(call_id=1, model="m", files={"file:a": b"x"}), "explicit")
    assert "the 'config' parameter is required" in e.value.message
    with pytest.raises(TritonMPError) as e:
        check_call(ModelLoadCall(call_id=1, model="../m"), "explicit")
    assert "path traversal" in e.value.message


@pytest.fixture
def control() -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []

    def load(name: str, config: str, files: dict[str, bytes]) -> None:
        calls.append(("load", name, config, *files))
        if name == "bad":
            raise TritonMPError("failed to load 'bad', failed to poll from model repository")

    def unload(name: str, dependents: bool) -> None:
        calls.append(("unload", name, str(dependents)))

    pb_utils.set_model_control(load, unload, "caller_0_0")
    yield calls
    pb_utils.set_model_control(None, None)


def test_pb_utils_words_a_failed_call_as_upstream(control: list[tuple[str, ...]]) -> None:
    pb_utils.load_model(b"m", config="{}", files={"file:1/model.py": b"x"})
    pb_utils.unload_model("m", unload_dependents=True)
    assert control == [("load", "m", "{}", "file:1/model.py"), ("unload", "m", "True")]
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils.load_model("bad")
    assert str(e.value) == (
        "Failed to load model: Failed to process the request for model 'caller_0_0', "
        "message: failed to load 'bad', failed to poll from model repository"
    )
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils.load_model("m", files=["file:1/model.py"])  # type: ignore[arg-type]
    assert str(e.value) == (
        "failed to load model 'm', files should be a dictionary of file paths and file contents"
    )
    with pytest.raises(TypeError):
        pb_utils.load_model("m", config="{}", files={"file:1/model.py": "text"})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("text", "version"), [("", -1), ("3", 3), (" 7", 7), ("12abc", 12), ("+4", 4), ("0", 0)]
)
def test_versions_read_as_stol(text: str, version: int) -> None:
    assert pb_utils._version_number(text) == version  # noqa: SLF001


@pytest.mark.parametrize(
    ("text", "detail"), [("x", " (details: stol)"), ("9" * 20, " (details: stol)"), ("-1", "")]
)
def test_versions_that_are_no_number_are_refused(
    control: list[tuple[str, ...]], text: str, detail: str
) -> None:
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils._version_number(text)  # noqa: SLF001
    assert str(e.value) == (
        "Failed to check model readiness: Failed to process the request for model "
        f"'caller_0_0', message: failed to get model version from specified version string "
        f"'{text}'{detail}, version should be an integral value > 0"
    )
