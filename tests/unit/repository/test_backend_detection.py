"""The backend a model folder's files name (Triton core's AutoCompleteBackendFields), the ``config`` override's
poll-time checks and the folder time that ends a kept override (kserve_v2.repository)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.repository import config as cfg
from kserve_v2.repository.config import ConfigError
from kserve_v2.repository.layout import modified_ns
from kserve_v2.repository.overrides import KeptConfig, OverrideError, parse_config_override


def folder(root: Path, name: str, files: dict[str, str], config: str | None = None) -> Path:
    """A model folder with ``files`` (relative path -> text; a path ending in '/' is a folder)."""
    model = root / name
    model.mkdir(parents=True)
    for relative, text in files.items():
        path = model / relative
        if relative.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if config is not None:
        (model / cfg.CONFIG_FILE).write_text(config)
    return model


def detected(model: Path, config: str = "", name: str | None = None) -> tuple[str, str]:
    parsed = text_format.Parse(config, mc.ModelConfig())
    parsed.name = name or model.name
    cfg.complete_backend(parsed, model)
    return parsed.backend, parsed.platform


@pytest.mark.parametrize("files, config, expected", [
    ({"1/model.py": ""}, "", ("python", "")),
    ({"1/model.onnx": ""}, "", ("onnxruntime", "onnxruntime_onnx")),
    ({"1/model.onnx/": ""}, "", ("onnxruntime", "onnxruntime_onnx")),  # a large ONNX model is a folder
    ({"1/model.onnx": "", "1/model.py": ""}, "", ("onnxruntime", "onnxruntime_onnx")),  # ONNX Runtime comes first
    ({"1/model.plan": "", "1/model.py": ""}, "", ("tensorrt", "tensorrt_plan")),
    ({"1/model.savedmodel/": ""}, "", ("tensorflow", "tensorflow_savedmodel")),
    ({"1/model.graphdef": ""}, "", ("tensorflow", "tensorflow_graphdef")),
    ({"1/model.xml": ""}, "", ("openvino", "")),
    ({"1/model.pt": ""}, "", ("pytorch", "pytorch_libtorch")),
    ({"1/model.pt2": ""}, "", ("pytorch", "torch_aoti")),
    ({"1/model.py": ""}, 'default_model_filename: "model.py"', ("python", "")),
    ({"1/other.py": ""}, 'default_model_filename: "model.py"', ("python", "")),  # the name alone decides
    ({"1/model.onnx": ""}, 'default_model_filename: "model.py"', ("python", "")),
    ({"1/model.py": ""}, 'platform: "onnxruntime_onnx"', ("onnxruntime", "onnxruntime_onnx")),
    ({"1/model.py": ""}, 'backend: "onnxruntime"', ("onnxruntime", "onnxruntime_onnx")),
    ({"1/model.onnx": ""}, 'platform: "ensemble"', ("", "ensemble")),
    ({"1/model.onnx": ""}, 'backend: "tensorflow"', ("tensorflow", "")),
    # only the lowest version folder is looked into, as Triton looks into the first
    ({"1/model.py": "", "2/model.onnx": ""}, "", ("python", "")),
    ({"notaversion/model.onnx": "", "3/model.py": ""}, "", ("python", "")),
    # a file name no backend claims, or no version folder: left to the onnxruntime default by read_config
    ({"1/model.py": ""}, 'default_model_filename: "custom.onnx"', ("", "")),
    ({}, "", ("", "")),
])
def test_backend_from_the_files(tmp_path: Path, files: dict[str, str], config: str, expected: tuple[str, str]) -> None:
    assert detected(folder(tmp_path, "m", files), config) == expected


def test_no_backend_claims_the_version_folder(tmp_path: Path) -> None:
    model = folder(tmp_path, "m", {"1/weights.bin": "", "2/model.onnx": ""})
    with pytest.raises(ConfigError, match=r"^Invalid model name: Could not determine backend for model 'm' with no "
                                          r"backend in model configuration\. Expected model name of the form "
                                          r"'model\.<backend_name>'\.$"):
        detected(model)
    custom = folder(tmp_path, "model.text_embedding", {"1/weights.bin": ""})
    assert detected(custom) == ("text_embedding", "")  # Triton's custom backends: model.<backend>


def test_read_config_detects_and_refuses_what_this_server_does_not_run(tmp_path: Path) -> None:
    python = cfg.read_config(folder(tmp_path, "py", {"1/model.py": ""}), "py")
    assert (python.backend, python.platform) == ("python", "")
    onnx = cfg.read_config(folder(tmp_path, "o", {"1/model.onnx": ""}, "max_batch_size: 2"), "o")
    assert (onnx.backend, onnx.platform, onnx.max_batch_size) == ("onnxruntime", "onnxruntime_onnx", 2)
    overridden = cfg.read_config(folder(tmp_path, "p", {"1/model.py": ""}, 'backend: "onnxruntime"'), "p",
                                 override_json='{"max_batch_size": 1}')
    assert overridden.backend == "python"  # the override replaces config.pbtxt, and names no backend
    with pytest.raises(ConfigError, match="unsupported platform 'tensorrt_plan' / backend 'tensorrt'"):
        cfg.read_config(folder(tmp_path, "t", {"1/model.plan": ""}), "t")


@pytest.mark.parametrize("text, detail", [
    ('"parameters": {"config": {{"max_batch_size": "16"}}}', "Invalid config override: "),  # Triton's client examples
    ("{not json", "Invalid config override: "),
    ('{"max_batch_size": "many"}', "Invalid config override: "),
    ('{"no_such_field": 1}', "Invalid config override: "),  # unknown fields are refused, as Triton's parser does
    ("[" * 100000 + "]" * 100000, "Invalid config override: "),
    ('{"name": "other"}', "unexpected directory name 'm' for model 'other', directory name must equal model name"),
])
def test_config_override_refused_at_poll(text: str, detail: str) -> None:
    with pytest.raises(OverrideError) as err:
        parse_config_override(text, "m")
    assert str(err.value).startswith(detail) and not err.value.unsafe


def test_config_override_accepted_at_poll() -> None:
    assert parse_config_override('{"max_batch_size":"16"}', "m").max_batch_size == 16  # a quoted integer, as protobuf JSON
    assert parse_config_override('{"name": "m", "backend": "python"}', "m").backend == "python"


def test_modified_ns_is_the_newest_time_in_the_folder(tmp_path: Path) -> None:
    model = folder(tmp_path, "m", {"1/model.onnx": "", "1/deep/er/file": ""}, "max_batch_size: 1")
    old = time.time_ns() - 10**11
    for path in [*model.rglob("*"), model]:
        os.utime(path, ns=(old, old))
    assert modified_ns(model) == old
    newer = old + 10**9
    os.utime(model / "1" / "deep" / "er" / "file", ns=(newer, newer))
    assert modified_ns(model) == newer
    (model / "1" / "loop").symlink_to(model, target_is_directory=True)  # a cycle ends
    assert modified_ns(model) >= newer
    assert modified_ns(tmp_path / "missing") == 0


def test_kept_config_stamp(tmp_path: Path) -> None:
    with_file = folder(tmp_path, "a", {"1/model.onnx": ""}, "")
    before = time.time_ns()
    assert before <= KeptConfig.taken("{}", with_file, cfg.CONFIG_FILE).stamp_ns <= time.time_ns()
    without = folder(tmp_path, "b", {"1/model.onnx": ""})
    old = time.time_ns() - 10**11
    for path in [*without.rglob("*"), without]:
        os.utime(path, ns=(old, old))
    assert KeptConfig.taken("{}", without, cfg.CONFIG_FILE) == KeptConfig("{}", old)  # the folder's own time
