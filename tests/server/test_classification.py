"""Triton's classification extension through a real server and unmodified tritonclient: outputs
requested with ``class_count`` come back as BYTES "<value>:<index>[:<label>]" over gRPC and over
REST (JSON and binary), with labels from ``label_filename``, for models with and without batching
and for an ensemble; bad parameters get Triton's texts; ServerMetadata lists the extension."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import Server, add_model, http_json, make_model, start_server

SCORES = np.array([[0.1, 0.9, 0.5, 0.3, 0.7], [5.0, 4.0, 3.0, 2.0, 1.0]], np.float32)
# line 3 is empty and there is no line 5: those indices have no label
LABELS = "label0\nlabel1\n\nlabel3\n"
EXPECTED = [["0.900000:1:label1", "0.700000:4", "0.500000:2"], ["5.000000:0:label0", "4.000000:1:label1", "3.000000:2"]]
TRANSPORTS = ["grpc", "http-json", "http-binary"]


def _scores(repository: Path, name: str, max_batch_size: int, labels: str | None = None) -> None:
    """OUTPUT0 = INPUT0 (FP32 [5]), and OUTPUT1 = INPUT0 as INT32; OUTPUT0's labels when given."""
    shape = [None, 5] if max_batch_size else [5]
    model = make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]),
                        helper.make_node("Cast", ["INPUT0"], ["OUTPUT1"], to=TensorProto.INT32)],
                       [("INPUT0", TensorProto.FLOAT, shape)],
                       [("OUTPUT0", TensorProto.FLOAT, shape), ("OUTPUT1", TensorProto.INT32, shape)])
    label = ' label_filename: "labels.txt"' if labels is not None else ""
    folder = add_model(repository, name, model, (
        f'max_batch_size: {max_batch_size}\ninput [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] }}]\n'
        f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ]{label} }},'
        f' {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 5 ] }}]\n'))
    if labels is not None:
        (folder / "labels.txt").write_text(labels)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("repo")
    _scores(repository, "scores", 8, LABELS)
    _scores(repository, "scores_nobatch", 0)
    add_model(repository, "text", make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                                             [("INPUT0", TensorProto.STRING, [None, 2])],
                                             [("OUTPUT0", TensorProto.STRING, [None, 2])]))
    ensemble = repository / "scores_ensemble"
    (ensemble / "1").mkdir(parents=True)
    (ensemble / "labels.txt").write_text("cat\ndog\nbird\nfish\nfrog\n")
    (ensemble / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\ninput [{ name: "X" data_type: TYPE_FP32 dims: [ 5 ] }]\n'
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" }]\n'
        'ensemble_scheduling { step [{ model_name: "scores" model_version: -1 input_map { key: "INPUT0" value: "X" }'
        ' output_map { key: "OUTPUT0" value: "Y" } }] }\n')
    unlabelled = repository / "scores_ensemble_unlabelled"  # no label file of its own: the step's labels
    (unlabelled / "1").mkdir(parents=True)
    (unlabelled / "config.pbtxt").write_text(
        (ensemble / "config.pbtxt").read_text().replace(' label_filename: "labels.txt"', ""))
    _scores(repository, "labels_missing", 8)
    (repository / "labels_missing" / "config.pbtxt").write_text(
        (repository / "labels_missing" / "config.pbtxt").read_text().replace(
            'dims: [ 5 ] },', 'dims: [ 5 ] label_filename: "absent.txt" },', 1))
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--exit-on-error=false")  # labels_missing fails
    yield server
    assert server.stop() == 0


def _infer(server: Server, transport: str, model: str, data: np.ndarray, classes: dict[str, int],
           input_name: str = "INPUT0", raw: tuple[str, ...] = ()):
    """Infer with each output of ``classes`` asked for as that many classes and those of ``raw`` as tensors."""
    if transport == "grpc":
        tensor = grpcclient.InferInput(input_name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        outputs = [grpcclient.InferRequestedOutput(n, class_count=c) for n, c in classes.items()]
        outputs += [grpcclient.InferRequestedOutput(n) for n in raw]
        with grpcclient.InferenceServerClient(server.url) as client:
            return client.infer(model, [tensor], outputs=outputs)
    binary = transport == "http-binary"
    tensor = httpclient.InferInput(input_name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary, class_count=c) for n, c in classes.items()]
    outputs += [httpclient.InferRequestedOutput(n, binary_data=binary) for n in raw]
    with httpclient.InferenceServerClient(server.http_url) as client:
        return client.infer(model, [tensor], outputs=outputs)


def _texts(array: np.ndarray) -> list:
    return np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])(array).tolist()


def _datatype(result, name: str) -> str:
    output = result.get_output(name)
    return output.datatype if hasattr(output, "datatype") else output["datatype"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_classes_with_labels_beside_a_raw_output(server: Server, transport: str) -> None:
    result = _infer(server, transport, "scores", SCORES, {"OUTPUT0": 3}, raw=("OUTPUT1",))
    assert _datatype(result, "OUTPUT0") == "BYTES"
    assert result.as_numpy("OUTPUT0").shape == (2, 3)
    assert _texts(result.as_numpy("OUTPUT0")) == EXPECTED
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), SCORES.astype(np.int32))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_classes_without_labels_and_without_batching(server: Server, transport: str) -> None:
    result = _infer(server, transport, "scores_nobatch", SCORES[0], {"OUTPUT0": 2, "OUTPUT1": 9})
    assert _texts(result.as_numpy("OUTPUT0")) == ["0.900000:1", "0.700000:4"]  # shape [2]: no batch dim
    # INT32 values as integers; the count is capped at the row's 5 elements; ties keep index order
    assert _texts(result.as_numpy("OUTPUT1")) == ["0:0", "0:1", "0:2", "0:3", "0:4"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_ensemble_output_is_classified_with_the_ensembles_labels(server: Server, transport: str) -> None:
    result = _infer(server, transport, "scores_ensemble", SCORES, {"Y": 1}, input_name="X")
    assert _texts(result.as_numpy("Y")) == [["0.900000:1:dog"], ["5.000000:0:cat"]]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_ensemble_without_labels_classifies_with_its_steps_labels(server: Server, transport: str) -> None:
    """Triton completes an ensemble output's labels from the step output written to it (its qa's
    "ensemble should still generate proper label without label file", L0_infer test_class_*)."""
    result = _infer(server, transport, "scores_ensemble_unlabelled", SCORES, {"Y": 3}, input_name="X")
    assert _texts(result.as_numpy("Y")) == EXPECTED


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_bad_classification_requests_get_tritons_text(server: Server, transport: str) -> None:
    """A BYTES output cannot be classified; a count of 0 is refused (tritonclient leaves a
    class_count of 0 out, so the requests are written here: the gRPC message and the JSON body)."""
    module = grpcclient if transport == "grpc" else httpclient
    tensor = module.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    client = (grpcclient.InferenceServerClient(server.url) if transport == "grpc"
              else httpclient.InferenceServerClient(server.http_url))
    with client, pytest.raises(InferenceServerException) as raised:
        client.infer("text", [tensor], outputs=[module.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert raised.value.message() == "class result not available for output due to unsupported type 'BYTES'"
    assert raised.value.status() == ("StatusCode.INVALID_ARGUMENT" if transport == "grpc" else "400")
    if transport == "grpc":
        request = service_pb2.ModelInferRequest(model_name="scores", raw_input_contents=[SCORES.tobytes()])
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 5])
        request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 0
        with grpc.insecure_channel(server.url) as channel, pytest.raises(grpc.RpcError) as failed:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert failed.value.details() == "invalid value for 'classification' parameter, expected >= 0"
        return
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 5], "data": SCORES.reshape(-1).tolist()}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 0}}]}
    status, answer = http_json(server, "/v2/models/scores/infer", body, timeout=30)
    assert status == 400
    assert answer == {"error": "invalid value for 'classification' parameter, expected >= 0"}


def test_server_metadata_lists_classification_and_a_missing_label_file_fails_the_load(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        assert "classification" in client.get_server_metadata().extensions
        reasons = {m.name: m.reason for m in client.get_model_repository_index().models}
    with httpclient.InferenceServerClient(server.http_url) as http:
        assert "classification" in http.get_server_metadata()["extensions"]
    assert reasons["labels_missing"] == ("model 'labels_missing': label_filename 'absent.txt' of output 'OUTPUT0' "
                                         "cannot be read: No such file or directory")
