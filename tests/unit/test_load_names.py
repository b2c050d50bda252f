"""A load's model name and ``file:`` paths, checked as upstream core checks them
(``ValidateModelName``, LocalizeRepoAgent's "must stay within model directory")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from triton_mp.common.errors import ConfigError, ErrorCode, InvalidRequest
from triton_mp.frontend.admin.repository import check_model_name
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.model_config.loader import load_model
from triton_mp.supervisor.models.load_requests import LoadRequest, _write_files, load_answer


@pytest.mark.parametrize("name", ["a/b", "..", " .. ", "/etc"])
def test_path_traversal_in_a_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        check_model_name(name)
    assert e.value.message == (
        f"invalid model name '{name}', model name must not contain path traversal characters"
    )


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_an_empty_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        check_model_name(name)
    assert e.value.message == "Model name cannot be empty. Please enter a valid name to deploy."


@pytest.mark.parametrize("name", ["m", "..m", "a..b", "m "])
def test_other_names_pass(name: str) -> None:
    check_model_name(name)


def test_files_are_written_within_the_model_directory() -> None:
    req = LoadRequest("m", files={"/1/model.py": b"a", "1/../config.txt": b"b"})
    temp = _write_files(req, "t")
    try:
        assert (temp / "m" / "1" / "model.py").read_bytes() == b"a"
        assert (temp / "m" / "config.txt").read_bytes() == b"b"
    finally:
        shutil.rmtree(temp)


@pytest.mark.parametrize("rel", ["../x", "1/../../x", "/../x"])
def test_a_file_outside_the_model_directory_is_refused(rel: str) -> None:
    with pytest.raises(ConfigError) as e:
        _write_files(LoadRequest("m", files={rel: b"x"}), "t")
    assert e.value.message.startswith(f"Invalid file parameter 'file:{rel}' with normalized path")
    assert e.value.message.endswith("/x' must stay within model directory.")


def test_a_config_that_does_not_parse_answers_tritons_poll_failure(tmp_path: Path) -> None:
    """Triton's poll fails on a config.pbtxt it cannot parse: the load answers INTERNAL
    "failed to poll from model repository"; other bad models keep their reason."""
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "config.pbtxt").write_text('name: "bad"\nthis is { not pbtxt\n')
    req = LoadRequest("bad", result=ErrorInfo(ErrorCode.INVALID_ARG, "reason"))
    rm = load_model(tmp_path / "bad")
    assert (rm.error or "").startswith("failed to read text proto from")
    assert load_answer(req, rm) == ErrorInfo(
        ErrorCode.INTERNAL, "failed to load 'bad', failed to poll from model repository"
    )
    (tmp_path / "bad" / "config.pbtxt").write_text('name: "bad"\nbackend: "nope"\n')
    assert load_answer(req, load_model(tmp_path / "bad")) == req.result


def test_a_file_that_cannot_be_written_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    """A NUL byte in a ``file:`` path (found by a new-user check): INVALID_ARG, and the
    temporary directory is removed (it was left behind on every attempt)."""
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("triton_mp_nul_*"))
    with pytest.raises(ConfigError) as e:
        _write_files(LoadRequest("m", files={"1/model.py": b"x", "1/\x00.py": b"x"}), "nul")
    assert e.value.message.startswith("failed to load 'm': cannot write a file parameter: ")
    assert "null byte" in e.value.message
    assert set(Path(tempfile.gettempdir()).glob("triton_mp_nul_*")) == before
