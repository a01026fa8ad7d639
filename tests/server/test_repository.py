"""Model repository: versions and policies, auto-complete, reshape, a corrupt model, control mode none."""

from __future__ import annotations

import itertools
import re
from datetime import datetime

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import add_model, http_json, identity_model, make_model, slow_loading_model, start_server


def _scale_model(factor: float):
    """OUTPUT0 = INPUT0 * factor, FP32 [batch, 4]: tells versions apart."""
    const = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [], [factor]))
    return make_model([const, helper.make_node("Mul", ["INPUT0", "k"], ["OUTPUT0"])],
                      [("INPUT0", TensorProto.FLOAT, [None, 4])], [("OUTPUT0", TensorProto.FLOAT, [None, 4])])


def _infer(client, model: str, version: str = "", data=None):
    data = np.ones((1, 4), np.float32) if data is None else data
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor], model_version=version).as_numpy("OUTPUT0")


@pytest.fixture(scope="module")
def repo_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    for name, policy in (("latest_default", ""), ("latest_two", "version_policy: { latest: { num_versions: 2 } }"),
                         ("all_versions", "version_policy: { all: {} }"),
                         ("specific", "version_policy: { specific: { versions: [1, 3] } }")):
        for version in (1, 2, 3):
            add_model(repository, name, _scale_model(float(version)), versions=(version,))
        (repository / name / "config.pbtxt").write_text(policy)
        (repository / name / "notaversion").mkdir()
        (repository / name / "04").mkdir()  # leading zero: not a version folder
    add_model(repository, "partial_config", _scale_model(1.0), 'max_batch_size: 2\ninput [{ name: "INPUT0" }]')
    reshape = make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                         [("INPUT0", TensorProto.FLOAT, [1, 2, 2])], [("OUTPUT0", TensorProto.FLOAT, [1, 2, 2])])
    add_model(repository, "reshaped", reshape, (
        'max_batch_size: 0\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] reshape: { shape: [1, 2, 2] } }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] reshape: { shape: [1, 2, 2] } }]\n'))
    (repository / "empty_folder").mkdir()
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--exit-on-error=false")
    yield server
    assert server.stop() == 0


def test_version_policies(repo_server) -> None:
    with grpcclient.InferenceServerClient(repo_server.url) as client:
        assert list(client.get_model_metadata("latest_default").versions) == ["3"]
        assert _infer(client, "latest_default")[0, 0] == 3.0
        assert not client.is_model_ready("latest_default", "1")
        assert list(client.get_model_metadata("latest_two").versions) == ["2", "3"]
        assert _infer(client, "latest_two", "2")[0, 0] == 2.0
        assert list(client.get_model_metadata("all_versions").versions) == ["1", "2", "3"]
        assert [_infer(client, "all_versions", v)[0, 0] for v in "123"] == [1.0, 2.0, 3.0]
        assert list(client.get_model_metadata("specific").versions) == ["1", "3"]
        with pytest.raises(InferenceServerException) as err:
            _infer(client, "specific", "2")
        assert "'specific' version 2 is not found" in err.value.message()
        stats = client.get_inference_statistics("all_versions")
        assert [s.version for s in stats.model_stats] == ["1", "2", "3"]


def test_auto_complete_from_graph_and_partial_config(repo_server) -> None:
    with grpcclient.InferenceServerClient(repo_server.url) as client:
        config = client.get_model_config("latest_default").config
        assert config.platform == "onnxruntime_onnx" and config.backend == "onnxruntime"
        assert config.max_batch_size == 4  # graph has a dynamic first dim and the config names no tensors
        assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("INPUT0", 11, [4])]
        assert [o.name for o in config.output] == ["OUTPUT0"]
        partial = client.get_model_config("partial_config").config
        assert partial.max_batch_size == 2 and partial.input[0].data_type == 11 and list(partial.input[0].dims) == [4]
        assert [o.name for o in partial.output] == ["OUTPUT0"]
        with pytest.raises(InferenceServerException) as err:
            _infer(client, "partial_config", data=np.ones((3, 4), np.float32))
        assert "batch-size must be <= 2" in err.value.message()


def test_reshape(repo_server) -> None:
    with grpcclient.InferenceServerClient(repo_server.url) as client:
        metadata = client.get_model_metadata("reshaped")
        assert list(metadata.inputs[0].shape) == [4]
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        result = client.infer("reshaped", [tensor])
        assert list(result.get_response().outputs[0].shape) == [4]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))


def test_index_and_control_mode_none(repo_server) -> None:
    with grpcclient.InferenceServerClient(repo_server.url) as client:
        index = client.get_model_repository_index().models
        rows = {(m.name, m.version): (m.state, m.reason) for m in index}
        assert rows[("latest_two", "2")] == ("READY", "") and rows[("latest_two", "3")] == ("READY", "")
        assert ("latest_two", "1") not in rows
        assert rows[("empty_folder", "")][0] == "UNAVAILABLE"
        assert "at least one version must be available" in rows[("empty_folder", "")][1]
        with grpc.insecure_channel(repo_server.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True)).models
        assert ready and all(m.state == "READY" for m in ready)
        assert "empty_folder" not in {m.name for m in ready}
        with httpclient.InferenceServerClient(repo_server.http_url) as rest:
            for call, status in ((client.load_model, "StatusCode.UNAVAILABLE"), (client.unload_model, "StatusCode.UNAVAILABLE"),
                                 (rest.load_model, "503"), (rest.unload_model, "503")):
                with pytest.raises(InferenceServerException) as err:
                    call("latest_default")
                # Triton's text in every mode that is not explicit (L0_grpc / L0_http python_*_aio_test)
                assert (err.value.status(), err.value.message()) == (
                    status, "explicit model load / unload is not allowed if polling is enabled")
        assert not client.is_server_ready()  # empty_folder failed at startup: strict readiness says not ready


def test_corrupt_model_is_unavailable_others_serve_and_server_not_ready(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "good", identity_model(TensorProto.FLOAT))
    add_model(repository, "corrupt", b"this is not an onnx model")
    server = start_server(repository, tmp_path, "--exit-on-error=false")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_live()
            assert not client.is_server_ready()
            index = {m.name: m for m in client.get_model_repository_index().models}
            assert index["corrupt"].state == "UNAVAILABLE" and index["corrupt"].version == "1"
            assert "Load model from <model folder>/1/model.onnx failed" in index["corrupt"].reason
            assert index["good"].state == "READY"
            assert not client.is_model_ready("corrupt")
            with pytest.raises(InferenceServerException) as err:
                _infer(client, "corrupt")
            assert "'corrupt' has no available versions" in err.value.message()
            data = np.arange(6, dtype=np.float32).reshape(2, 3)
            tensor = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
            tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("good", [tensor]).as_numpy("OUTPUT0"), data)
        with grpc.insecure_channel(server.url) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        assert server.stop() == 0


def test_non_strict_readiness_and_bad_configs(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "good", identity_model(TensorProto.FLOAT))
    add_model(repository, "bad_text", identity_model(TensorProto.FLOAT), "max_batch_size: [not valid")
    add_model(repository, "wrong_type", identity_model(TensorProto.FLOAT),
              'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [-1] }]')
    add_model(repository, "wrong_backend", identity_model(TensorProto.FLOAT), 'backend: "tensorflow"')
    add_model(repository, "no_batch_dim", identity_model(TensorProto.FLOAT, [2, 3]), "max_batch_size: 4")
    add_model(repository, "tuned", identity_model(TensorProto.FLOAT), (
        'parameters [{ key: "intra_op_thread_count" value: { string_value: "1" } },'
        ' { key: "execution_mode" value: { string_value: "1" } }]\noptimization { graph { level: -1 } }'))
    add_model(repository, "bad_parameter", identity_model(TensorProto.FLOAT),
              'parameters { key: "intra_op_thread_count" value: { string_value: "many" } }')
    add_model(repository, "gpu_only", identity_model(TensorProto.FLOAT), "instance_group [{ kind: KIND_GPU }]")
    add_model(repository, "bf16_and_bytes", make_model(  # ORT's Python API cannot feed these two together
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]), helper.make_node("Identity", ["INPUT1"], ["OUTPUT1"])],
        [("INPUT0", TensorProto.STRING, [-1]), ("INPUT1", TensorProto.BFLOAT16, [-1])],
        [("OUTPUT0", TensorProto.STRING, [-1]), ("OUTPUT1", TensorProto.BFLOAT16, [-1])]))
    scalar = ('max_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [DIMS] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [DIMS] }]')
    add_model(repository, "scalar_1dim", identity_model(TensorProto.FLOAT, []), scalar.replace("DIMS", "1"))
    add_model(repository, "scalar_2dim", identity_model(TensorProto.FLOAT, []), scalar.replace("DIMS", "2"))
    server = start_server(repository, tmp_path, "--strict-readiness", "false", "--exit-on-error=false")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready()
            index = {m.name: m for m in client.get_model_repository_index().models}
            assert "failed to parse model configuration" in index["bad_text"].reason
            reasons = {name: index[name].reason.split("version 1: ", 1)[-1]
                       for name in ("wrong_type", "no_batch_dim", "scalar_2dim")}
            assert reasons == {  # Triton's onnxruntime backend texts (L0_scalar_io: a scalar with dims [2])
                "wrong_type": "unable to load model 'wrong_type', configuration expects datatype TYPE_INT32 for input "
                              "'INPUT0', model provides TYPE_FP32",
                "no_batch_dim": "model 'no_batch_dim', tensor 'INPUT0': for the model to support batching the shape "
                                "should have at least 1 dimension and the first dimension must be -1; but shape "
                                "expected by the model is [2,3]",
                "scalar_2dim": "unable to load model 'scalar_2dim', scalar tensor 'INPUT0', should only provide 1 in the "
                               "model configuration when the model doesn't support batching. Model configuration "
                               "provided: [2]."}
            assert index["scalar_1dim"].state == "READY"
            assert "unsupported platform" in index["wrong_backend"].reason
            assert index["tuned"].state == "READY"
            assert "invalid literal" in index["bad_parameter"].reason
            assert ("ONNX Runtime's Python API cannot run a graph with both BYTES inputs ['INPUT0'] and BF16 tensors "
                    "['INPUT1', 'OUTPUT1']") in index["bf16_and_bytes"].reason
            assert "asks for GPUs" in index["gpu_only"].reason or index["gpu_only"].state == "READY"  # READY on GPU hosts
            assert {m.state for n, m in index.items()
                    if n not in ("good", "tuned", "gpu_only", "scalar_1dim")} == {"UNAVAILABLE"}
            data = np.ones((1, 3), np.float32)
            tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("tuned", [tensor]).as_numpy("OUTPUT0"), data)
            scalar_in = grpcclient.InferInput("INPUT0", [1], "FP32")  # L0_scalar_io: dims [1] for the model's []
            scalar_in.set_data_from_numpy(np.array([2.5], np.float32))
            assert client.infer("scalar_1dim", [scalar_in]).as_numpy("OUTPUT0").tolist() == [2.5]
    finally:
        assert server.stop() == 0


CHAIN = """name: "chain"
platform: "ensemble"
max_batch_size: 4
input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]
ensemble_scheduling { step [
  { model_name: "doubler" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "tripler" model_version: -1 input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""


def test_several_repositories_serve_as_one(tmp_path) -> None:
    """--model-repository twice: the models of both are served over gRPC and REST, an ensemble in one
    runs steps from both, explicit load and unload find a model in either, and a name in both is
    refused with its reason (Triton: a model name must be unique across the repositories)."""
    first, second = tmp_path / "first", tmp_path / "second"
    add_model(first, "doubler", _scale_model(2.0))
    add_model(second, "tripler", _scale_model(3.0))
    (second / "chain" / "1").mkdir(parents=True)
    (second / "chain" / "config.pbtxt").write_text(CHAIN)
    for repository in (first, second):
        add_model(repository, "twice", _scale_model(5.0))
    server = start_server(first, tmp_path / "logs", "--model-repository", str(second), "--strict-readiness", "false",
                          "--exit-on-error=false")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            index = {m.name: m for m in client.get_model_repository_index().models}
            assert {name: m.state for name, m in index.items()} == {
                "doubler": "READY", "tripler": "READY", "chain": "READY", "twice": "UNAVAILABLE"}
            assert index["twice"].reason == "model appears in two or more repositories"  # Triton's text
            assert _infer(client, "doubler")[0, 0] == 2.0 and _infer(client, "tripler")[0, 0] == 3.0
            tensor = grpcclient.InferInput("IN", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            assert client.infer("chain", [tensor]).as_numpy("OUT").tolist() == [[6.0] * 4]
        status, answer = http_json(server, "/v2/models/tripler/infer",
                                   {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]})
        assert status == 200 and answer["outputs"][0]["data"] == [3.0] * 4
    finally:
        assert server.stop() == 0
    explicit = start_server(first, tmp_path / "explicit", "--model-repository", str(second),
                            "--model-control-mode", "explicit")
    try:
        with grpcclient.InferenceServerClient(explicit.url) as client:
            for name in ("tripler", "doubler"):  # from the second repository, then the first
                client.load_model(name)
            client.load_model("chain")
            assert _infer(client, "tripler")[0, 0] == 3.0 and _infer(client, "doubler")[0, 0] == 2.0
            client.unload_model("tripler")
            assert not client.is_model_ready("tripler") and client.is_model_ready("doubler")
            with pytest.raises(InferenceServerException, match="appears in more than one model repository"):
                client.load_model("twice")
    finally:
        assert explicit.stop() == 0


def _load_spans(log: str) -> list[tuple[float, float]]:
    """(start, end) in seconds of the day of each "loaded model 'slow<i>'" line: its time less its duration."""
    spans = []
    for stamp, ms in re.findall(r"(\d\d:\d\d:\d\d,\d{3}) INFO kserve_v2\.repository\.manager: loaded model 'slow\d' "
                                r"versions \[1\] in ([\d.]+) ms", log):
        clock = datetime.strptime(stamp, "%H:%M:%S,%f")
        end = clock.hour * 3600 + clock.minute * 60 + clock.second + clock.microsecond / 1e6
        spans.append((end - float(ms) / 1000, end))
    return sorted(spans)


def test_model_load_thread_count_loads_startup_models_at_once(tmp_path) -> None:
    """Triton's --model-load-thread-count (default 4): the startup loads overlap; with 1 they follow one another."""
    repository = tmp_path / "repo"
    slow = slow_loading_model()  # ONNX Runtime takes about a second to optimise it
    for index in range(3):
        add_model(repository, f"slow{index}", slow)
    for count in ("1", "4"):
        server = start_server(repository, tmp_path / count, "--model-load-thread-count", count, timeout=300)
        log = server.log()
        assert server.stop() == 0
        spans = _load_spans(log)
        assert len(spans) == 3, log
        if count == "1":  # each starts once the one before has ended (log stamps are to the millisecond)
            assert all(later[0] >= earlier[1] - 0.005 for earlier, later in itertools.pairwise(spans)), spans
        else:  # every load began before any ended
            assert max(start for start, _ in spans) < min(end for _, end in spans), spans
