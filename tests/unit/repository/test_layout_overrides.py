"""Repository names and paths (kserve_v2.repository.layout, overrides): nothing leaves its folder."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from google.protobuf import text_format

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.errors import InternalError, InvalidInput
from kserve_v2.repository import layout, overrides


@pytest.mark.parametrize("name", ["", "  ", ".", "..", " .. ", "a/b", "/abs", "a\\b", "a\0b", "x" * 256])
def test_unsafe_model_names(name: str) -> None:
    with pytest.raises(InvalidInput):
        layout.validate_model_name(name)


@pytest.mark.parametrize("name", ["simple", "...", "model..1", "é" * 127, "with space"])
def test_safe_model_names(name: str) -> None:
    assert layout.validate_model_name(name) == name


def test_version_dirs_are_positive_integers_without_leading_zeros(tmp_path: Path) -> None:
    for name in ("1", "3", "10", "01", "0", "v2", "-1"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    assert layout.version_dirs(tmp_path) == [1, 3, 10]


@pytest.mark.parametrize(("policy", "expected"), [
    ("", [5]), ("latest { num_versions: 2 }", [3, 5]), ("all {}", [1, 3, 5]),
    ("specific { versions: [1, 4, 5] }", [1, 5]),
])
def test_select_versions(policy: str, expected: list[int]) -> None:
    assert layout.select_versions([1, 3, 5], text_format.Parse(policy, mc.ModelVersionPolicy())) == expected


def test_model_dirs_finds_names_in_every_repository(tmp_path: Path) -> None:
    for repo, model in (("r1", "a"), ("r1", ".hidden"), ("r2", "a"), ("r2", "b")):
        (tmp_path / repo / model).mkdir(parents=True)
    found = layout.model_dirs([tmp_path / "r1", tmp_path / "r2"])
    assert sorted(found) == ["a", "b"] and len(found["a"]) == 2


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "1/../../x", "a//b", "./a", "a\\b", "a\0b",
                                  "/".join(["d"] * 17), "x" * 256])
def test_unsafe_override_paths(path: str) -> None:
    with pytest.raises(overrides.OverrideError, match="file: path") as err:
        overrides.check_relative_path(path)
    assert err.value.unsafe is (path != "x" * 256)  # an over-long component is unwritable, not an escape


def test_override_failures_answer_tritons_poll_text() -> None:
    """Triton's core reports a file: override it cannot localize as a failed poll (L0_lifecycle test_file_override)."""
    for unsafe, kind in ((False, InternalError), (True, InvalidInput)):
        answer = overrides.poll_failure("m", overrides.OverrideError("detail", unsafe=unsafe))
        assert type(answer) is kind and str(answer) == "failed to load 'm', failed to poll from model repository"


def test_safe_override_path_is_normalised() -> None:
    assert overrides.check_relative_path("1/model.onnx") == "1/model.onnx"
    assert overrides.check_relative_path("/".join(["d"] * 16)) == "/".join(["d"] * 16)


def parameter(**kind: object) -> pb.ModelRepositoryParameter:
    return pb.ModelRepositoryParameter(**kind)


def test_load_parameters() -> None:
    loaded = overrides.parse_load_parameters({"config": parameter(string_param="{}"),
                                              "file:1/model.onnx": parameter(bytes_param=b"onnx")})
    assert loaded.config_json == "{}" and dict(loaded.files) == {"1/model.onnx": b"onnx"}
    with pytest.raises(InvalidInput, match="Unrecognized load parameter 'config' with type 'int64'"):
        overrides.parse_load_parameters({"config": parameter(int64_param=1)})
    with pytest.raises(overrides.OverrideError, match="Load parameter 'config' must be specified for model file "
                                                      "override"):
        overrides.parse_load_parameters({"file:1/model.onnx": parameter(bytes_param=b"")})
    with pytest.raises(overrides.OverrideError, match="file: path"):
        overrides.parse_load_parameters({"config": parameter(string_param="{}"),
                                         "file:../model.onnx": parameter(bytes_param=b"")})


def test_private_folder_holds_exactly_the_files() -> None:
    root = overrides.write_private_folder({"1/model.onnx": b"onnx", "labels.txt": b"a\nb"})
    try:
        assert (root.stat().st_mode & 0o777) == 0o700
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == ["1/model.onnx", "labels.txt"]
    finally:
        shutil.rmtree(root)


def test_private_folder_is_removed_when_a_file_cannot_be_written() -> None:
    before = set(Path(tempfile.gettempdir()).glob("kserve_v2_override_*"))
    with pytest.raises(overrides.OverrideError, match="cannot be written") as err:
        overrides.write_private_folder({"a": b"file", "a/b": b"under a file"})
    assert not err.value.unsafe
    assert set(Path(tempfile.gettempdir()).glob("kserve_v2_override_*")) == before
