"""RepositoryModelLoad's ``config`` override as Triton's core polls and keeps it, and the backend a model
folder's files name, through a real server and unmodified tritonclient (gRPC and HTTP):

- the call sequences of Triton's client examples ``simple_grpc_model_control.py`` and
  ``simple_http_model_control.py`` (triton-inference-server/client): a ``config`` that is not JSON is a
  failed poll of the model (INTERNAL / 500), and the model serves on as it was;
- qa/L0_lifecycle ``test_config_override`` (triton-inference-server/server): a load without ``config``
  keeps the override of an earlier load until the model's folder changes or it is unloaded;
- python_backend's ``examples/auto_complete``: no config.pbtxt, the backend found from ``1/model.py``
  and the configuration from ``auto_complete_config``; ONNX models without config.pbtxt or backend.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import ROOT, Server, add_model, identity_model, make_model, start_server

POLL_FAILED = "failed to load '{}', failed to poll from model repository"
# the invalid override both client examples send, and their valid one
NOT_JSON = '"parameters": {"config": {{"max_batch_size": "16"}}}'
MAX_BATCH_16 = '{"max_batch_size":"16"}'


def _simple_repository(repository: Path, models: int) -> None:
    """The example repository's ``simple`` (INT32 INPUT0, INPUT1 [-1, 16] -> sum, difference; max_batch_size 8)
    and identity models beside it, ``models`` in all (the examples count the repository index)."""
    shutil.copytree(ROOT / "examples" / "model_repository" / "simple", repository / "simple")
    for index in range(models - 1):
        add_model(repository, f"other_{index}", identity_model(TensorProto.FLOAT))


def _infer_simple(client, module, rows: int) -> tuple[np.ndarray, np.ndarray]:
    data = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16)
    tensors = [module.InferInput(name, [rows, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(data)
    tensors[1].set_data_from_numpy(np.ones_like(data))
    result = client.infer("simple", tensors)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data - 1)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


@pytest.fixture
def simple_server(tmp_path: Path):
    repository = tmp_path / "models"
    _simple_repository(repository, 7)
    server = start_server(repository, tmp_path / "logs", "--model-control-mode", "explicit")
    yield server, repository
    assert server.stop() == 0


def test_simple_http_model_control_sequence(simple_server) -> None:
    """simple_http_model_control.py, call by call, with Triton's status and text checked as well."""
    server, _ = simple_server
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert len(client.get_model_repository_index()) == 7
        client.load_model("simple")
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config=NOT_JSON)
        assert "failed to load" in err.value.message()
        assert (err.value.status(), err.value.message()) == ("500", POLL_FAILED.format("simple"))
        # a failed poll changes nothing: the model serves on with its configuration
        assert client.is_model_ready("simple") and client.get_model_config("simple")["max_batch_size"] == 8
        client.load_model("simple", config=MAX_BATCH_16)
        assert client.get_model_config("simple")["max_batch_size"] == 16
        _infer_simple(client, httpclient, rows=16)
        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as err:
            client.load_model("wrong_model_name")
        assert "failed to load" in err.value.message()
    assert "Poll failed for model directory 'simple': Invalid config override: " in server.log()


def test_simple_grpc_model_control_sequence(simple_server) -> None:
    """simple_grpc_model_control.py, call by call (its repository holds eight models)."""
    server, repository = simple_server
    add_model(repository, "eighth", identity_model(TensorProto.FLOAT))
    with grpcclient.InferenceServerClient(server.url) as client:
        assert len(client.get_model_repository_index().models) == 8
        client.load_model("simple")
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config=NOT_JSON)
        assert "failed to load" in err.value.message()
        assert (err.value.status(), err.value.message()) == ("StatusCode.INTERNAL", POLL_FAILED.format("simple"))
        assert client.is_model_ready("simple") and client.get_model_config("simple").config.max_batch_size == 8
        _infer_simple(client, grpcclient, rows=8)
        client.load_model("simple", config=MAX_BATCH_16)
        assert client.get_model_config("simple").config.max_batch_size == 16
        _infer_simple(client, grpcclient, rows=16)
        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as err:  # a path component longer than NAME_MAX
            client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        assert err.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in err.value.message()
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as err:
            client.load_model("wrong_model_name")
        assert "failed to load" in err.value.message()
        # a config naming another model is a failed poll too (Triton: "unexpected directory name")
        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config='{"name": "other"}')
        assert (err.value.status(), err.value.message()) == ("StatusCode.INTERNAL", POLL_FAILED.format("simple"))
        assert not client.is_model_ready("simple")  # a model that was not loaded stays so
    assert "unexpected directory name 'simple' for model 'other'" in server.log()


def _float_add_sub():
    """qa_model_repository's onnx_float32_float32_float32: FP32 INPUT0, INPUT1 [-1, 16] -> sum, difference."""
    return make_model([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                       helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
                      [("INPUT0", TensorProto.FLOAT, [None, 16]), ("INPUT1", TensorProto.FLOAT, [None, 16])],
                      [("OUTPUT0", TensorProto.FLOAT, [None, 16]), ("OUTPUT1", TensorProto.FLOAT, [None, 16])])


LIFECYCLE_MODEL = "onnx_float32_float32_float32"
LIFECYCLE_CONFIG = f'''name: "{LIFECYCLE_MODEL}"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: {{ specific: {{ versions: [1, 3] }} }}
'''


def _infer_float(client, module, version: str) -> None:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensors = [module.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(data)
    tensors[1].set_data_from_numpy(np.ones_like(data))
    result = client.infer(LIFECYCLE_MODEL, tensors, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data - 1)


def _ready(client) -> tuple[bool, bool, bool]:
    return tuple(client.is_model_ready(LIFECYCLE_MODEL, v) for v in ("1", "2", "3"))


@pytest.fixture
def lifecycle_server(tmp_path: Path):
    """L0_lifecycle's test_config_override set-up: only version 2 holds a model, config.pbtxt asks for 1 and 3."""
    repository = tmp_path / "models"
    folder = add_model(repository, LIFECYCLE_MODEL, _float_add_sub(), LIFECYCLE_CONFIG, versions=(2,))
    for version in ("1", "3"):
        (folder / version).mkdir()
    server = start_server(repository, tmp_path / "logs", "--model-repository", str(repository),
                          "--model-control-mode", "explicit", "--strict-model-config", "false")
    yield server, folder
    assert server.stop() == 0


def test_l0_lifecycle_config_override_is_kept_until_unload(lifecycle_server) -> None:
    """qa/L0_lifecycle test_config_override, over HTTP then gRPC: the override outlives its load."""
    server, _ = lifecycle_server
    for client, module in ((httpclient.InferenceServerClient(server.http_url), httpclient),
                           (grpcclient.InferenceServerClient(server.url), grpcclient)):
        with client:
            assert client.is_server_live() and _ready(client) == (False, False, False)
            with pytest.raises(InferenceServerException) as err:  # config.pbtxt's versions hold no model
                client.load_model(LIFECYCLE_MODEL)
            assert f"load failed for model '{LIFECYCLE_MODEL}'" in err.value.message()
            client.load_model(LIFECYCLE_MODEL, config='\n{"backend":"onnxruntime","version_policy":'
                                                      '{"specific" : { "versions": [2] } } }\n')
            assert _ready(client) == (False, True, False)
            _infer_float(client, module, "2")
            # "request without additional config will retain the provided config"
            client.load_model(LIFECYCLE_MODEL)
            assert _ready(client) == (False, True, False)
            _infer_float(client, module, "2")
            client.unload_model(LIFECYCLE_MODEL)
            assert _ready(client) == (False, False, False)
    assert f"model '{LIFECYCLE_MODEL}' keeps the configuration an earlier load provided" in server.log()


def test_a_changed_folder_or_a_file_override_ends_the_kept_config(lifecycle_server) -> None:
    """Triton keeps the override while no file of the folder is newer than it; a file: override is never kept."""
    server, folder = lifecycle_server
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as err:  # version 1, the first, names no backend: Triton's rule
            client.load_model(LIFECYCLE_MODEL, config='{"version_policy": {"specific": {"versions": [2]}}}')
        assert "Could not determine backend for model" in err.value.message()
        client.load_model(LIFECYCLE_MODEL, config='{"backend": "onnxruntime", "max_batch_size": 3, '
                                                  '"version_policy": {"specific": {"versions": [2]}}}')
        client.load_model(LIFECYCLE_MODEL)  # kept
        assert _ready(client) == (False, True, False)
        assert client.get_model_config(LIFECYCLE_MODEL).config.max_batch_size == 3  # the override's, not the file's
        later = time.time_ns() + 5 * 10**9  # config.pbtxt changes after the override
        os.utime(folder / "config.pbtxt", ns=(later, later))
        with pytest.raises(InferenceServerException) as err:  # config.pbtxt again: versions 1 and 3
            client.load_model(LIFECYCLE_MODEL)
        assert f"load failed for model '{LIFECYCLE_MODEL}'" in err.value.message()
        # a load is all or nothing (Triton's ModelLifeCycle): version 2 serves on after the failed one
        assert _ready(client) == (False, True, False)
        model = _float_add_sub().SerializeToString()
        client.load_model(LIFECYCLE_MODEL, config='{"max_batch_size": 2}', files={"file:1/model.onnx": model})
        assert client.get_model_config(LIFECYCLE_MODEL).config.max_batch_size == 2
        assert _ready(client) == (True, False, False)
        with pytest.raises(InferenceServerException) as err:  # the repository's folder and config.pbtxt again
            client.load_model(LIFECYCLE_MODEL)
        assert f"load failed for model '{LIFECYCLE_MODEL}'" in err.value.message()


# python_backend examples/auto_complete/batch_model.py and nobatch_model.py (execute shortened)
AUTO_COMPLETE = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ]
        outputs = [
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ]
        config = auto_complete_model_config.as_dict()
        input_names = [input["name"] for input in config["input"]]
        output_names = [output["name"] for output in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        BATCHING
        return auto_complete_model_config

    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.output0_dtype)),
                pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.output0_dtype))]))
        return responses
'''
BATCHING = {"batch_auto_complete": "auto_complete_model_config.set_max_batch_size(4)\n"
                                   "        auto_complete_model_config.set_dynamic_batching()",
            "nobatch_auto_complete": "auto_complete_model_config.set_max_batch_size(0)"}


@pytest.fixture(scope="module")
def detected_server(tmp_path_factory) -> Server:
    repository = tmp_path_factory.mktemp("models")
    for name, batching in BATCHING.items():  # the example's repository: no config.pbtxt at all
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(AUTO_COMPLETE.replace("BATCHING", batching))
    add_model(repository, "onnx_no_config", _float_add_sub())
    add_model(repository, "onnx_no_backend", _float_add_sub(), "max_batch_size: 2\n")
    python_by_name = repository / "python_by_filename"
    (python_by_name / "1").mkdir(parents=True)
    (python_by_name / "1" / "model.py").write_text(AUTO_COMPLETE.replace("BATCHING", BATCHING["nobatch_auto_complete"]))
    (python_by_name / "config.pbtxt").write_text('default_model_filename: "model.py"\n')
    unknown = repository / "unknown_files" / "1"
    unknown.mkdir(parents=True)
    (unknown / "weights.bin").write_bytes(b"\0")
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit")
    yield server
    assert server.stop() == 0


def _infer_pair(client, module, model: str, shape: list[int]) -> None:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    tensors = [module.InferInput(name, shape, "FP32") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(data)
    tensors[1].set_data_from_numpy(np.full_like(data, 2))
    result = client.infer(model, tensors)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data - 2)


def test_python_auto_complete_example_without_config(detected_server) -> None:
    """python_backend's examples/auto_complete/client.py checks, then inference over HTTP and gRPC."""
    expected = {"batch_auto_complete": 4, "nobatch_auto_complete": 0}
    ios = [{"name": name, "data_type": "TYPE_FP32", "dims": [4]} for name in ("INPUT0", "INPUT1")]
    with httpclient.InferenceServerClient(detected_server.http_url) as client:
        for name, max_batch_size in expected.items():
            client.load_model(name)
            config = client.get_model_config(name)
            assert (config["backend"], config["max_batch_size"]) == ("python", max_batch_size)
            assert [{k: io[k] for k in ("name", "data_type", "dims")} for io in config["input"]] == ios
            assert [io["name"] for io in config["output"]] == ["OUTPUT0", "OUTPUT1"]
            _infer_pair(client, httpclient, name, [2, 4] if max_batch_size else [4])
        assert "dynamic_batching" in client.get_model_config("batch_auto_complete")
    with grpcclient.InferenceServerClient(detected_server.url) as client:
        _infer_pair(client, grpcclient, "batch_auto_complete", [3, 4])
        client.load_model("python_by_filename")  # default_model_filename "model.py" names the python backend
        assert client.get_model_config("python_by_filename").config.backend == "python"
        _infer_pair(client, grpcclient, "python_by_filename", [4])


def test_onnx_model_without_config_or_backend(detected_server) -> None:
    with grpcclient.InferenceServerClient(detected_server.url) as client:
        for name, max_batch_size in (("onnx_no_config", 4), ("onnx_no_backend", 2)):
            client.load_model(name)
            config = client.get_model_config(name).config
            assert (config.backend, config.platform, config.max_batch_size) == (
                "onnxruntime", "onnxruntime_onnx", max_batch_size)
            _infer_pair(client, grpcclient, name, [2, 16])
    with httpclient.InferenceServerClient(detected_server.http_url) as client:
        _infer_pair(client, httpclient, "onnx_no_backend", [1, 16])


def test_a_version_folder_no_backend_claims_is_triton_s_error(detected_server) -> None:
    with grpcclient.InferenceServerClient(detected_server.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.load_model("unknown_files")
        assert err.value.message() == (
            "load failed for model 'unknown_files': Invalid model name: Could not determine backend for model "
            "'unknown_files' with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'.\n")
        # the override names no backend either: the same, from the override's poll of the files
        with pytest.raises(InferenceServerException) as err:
            client.load_model("unknown_files", config='{"max_batch_size": 1}')
        assert "Could not determine backend for model 'unknown_files'" in err.value.message()
