"""Optional inputs (Triton's ``optional: true``, ``qa/L0_input_validation``) through a real server and
unmodified tritonclient, gRPC and HTTP: ONNX graph inputs that have an initializer serve as optional
inputs, a request may leave them out, and a missing required input gets Triton's text verbatim."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import Server, add_model, make_model, start_server

CLIENTS = {"grpc": grpcclient, "http": httpclient}


def _sum_model(initialized: dict[str, float]) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1 + INPUT2 + INPUT3 (FP32 [-1], INPUT3 [1]); the inputs in
    ``initialized`` are graph inputs with an initializer of that value."""
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["s01"]), helper.make_node("Add", ["s01", "INPUT2"], ["s012"]),
             helper.make_node("Add", ["s012", "INPUT3"], ["OUTPUT0"])]
    shapes = {"INPUT0": [None], "INPUT1": [None], "INPUT2": [None], "INPUT3": [1]}
    model = make_model(nodes, [(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()],
                       [("OUTPUT0", TensorProto.FLOAT, [None])])
    for name, value in initialized.items():
        model.graph.initializer.append(helper.make_tensor(name, TensorProto.FLOAT, [1], [value]))
    return model


def _config(name: str, optional: set[str]) -> str:
    dims = {"INPUT0": -1, "INPUT1": -1, "INPUT2": -1, "INPUT3": 1}
    inputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {d} ]{" optional: true" if n in optional else ""} }}'
                       for n, d in dims.items())
    return f'name: "{name}" max_batch_size: 0 input [ {inputs} ] output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]'


def _ensemble(repository: Path, name: str, step: str) -> None:
    """An ensemble of one step, ``step``, whose INPUT3 comes from its optional input E3."""
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    dims = {"E0": -1, "E1": -1, "E2": -1, "E3": 1}
    inputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {d} ]{" optional: true" if n == "E3" else ""} }}'
                       for n, d in dims.items())
    (folder / "config.pbtxt").write_text(
        f'platform: "ensemble" max_batch_size: 0 input [ {inputs} ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
        + " ".join(f'input_map {{ key: "INPUT{i}" value: "E{i}" }}' for i in range(4))
        + ' output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("repo")
    add_model(repository, "input_all_required", _sum_model({}), _config("input_all_required", set()))
    add_model(repository, "input_optional", _sum_model({"INPUT3": 100.0}), _config("input_optional", {"INPUT3"}))
    every = {"INPUT0": 1.0, "INPUT1": 2.0, "INPUT2": 3.0, "INPUT3": 4.0}
    add_model(repository, "input_all_optional", _sum_model(every), _config("input_all_optional", set(every)))
    add_model(repository, "initializers_not_completed", _sum_model({"INPUT3": 100.0}))  # no config.pbtxt
    add_model(repository, "initializer_not_marked", _sum_model({"INPUT3": 100.0}), _config("initializer_not_marked", set()))
    _ensemble(repository, "ensemble_optional", "input_optional")
    _ensemble(repository, "ensemble_into_required", "input_all_required")
    # initializer_not_marked fails to load on purpose: the server stays up without it
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--exit-on-error=false")
    yield server
    assert server.stop() == 0


def _infer(server: Server, protocol: str, model: str, values: dict[str, list[float]]) -> np.ndarray:
    module = CLIENTS[protocol]
    inputs = []
    for name, data in values.items():
        tensor = module.InferInput(name, [len(data)], "FP32")
        tensor.set_data_from_numpy(np.array(data, np.float32))
        inputs.append(tensor)
    url = server.url if protocol == "grpc" else server.http_url
    with module.InferenceServerClient(url) as client:
        return client.infer(model, inputs).as_numpy("OUTPUT0")


@pytest.mark.parametrize("protocol", CLIENTS)
def test_optional_inputs_present_and_absent(server: Server, protocol: str) -> None:
    given = {"INPUT0": [1.0, 2.0], "INPUT1": [10.0, 20.0], "INPUT2": [0.5, 0.5]}
    # absent: the graph's initializer (100) is used; present: the request's value replaces it
    np.testing.assert_array_equal(_infer(server, protocol, "input_optional", given), [111.5, 122.5])
    np.testing.assert_array_equal(_infer(server, protocol, "input_optional", {**given, "INPUT3": [-1.0]}), [10.5, 21.5])
    np.testing.assert_array_equal(_infer(server, protocol, "input_all_optional", {}), [10.0])
    np.testing.assert_array_equal(_infer(server, protocol, "input_all_optional", {"INPUT1": [5.0, 6.0]}), [13.0, 14.0])


@pytest.mark.parametrize("protocol", CLIENTS)
def test_an_ensemble_step_runs_without_the_optional_input_the_request_omits(server: Server, protocol: str) -> None:
    """As Triton's ensemble scheduler: the omitted optional ensemble input is left out of the step's
    request; a step model that requires it answers with its own text."""
    given = {"E0": [1.0, 2.0], "E1": [10.0, 20.0], "E2": [0.5, 0.5]}
    np.testing.assert_array_equal(_infer(server, protocol, "ensemble_optional", given), [111.5, 122.5])
    np.testing.assert_array_equal(_infer(server, protocol, "ensemble_optional", {**given, "E3": [-1.0]}), [10.5, 21.5])
    with pytest.raises(InferenceServerException) as raised:
        _infer(server, protocol, "ensemble_into_required", given)
    assert "missing required input(s) ['INPUT3']" in raised.value.message(), raised.value.message()
    assert raised.value.status() == ("StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400")


@pytest.mark.parametrize("protocol", CLIENTS)
@pytest.mark.parametrize(("model", "values", "text"), [
    ("input_all_required", {}, "expected 4 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], "
     "but missing required input(s) ['INPUT0','INPUT1','INPUT2','INPUT3']. Please provide all required input(s)."),
    ("input_all_required", {"INPUT0": [1.0]}, "expected 4 inputs but got 1 inputs for model 'input_all_required'. "
     "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1','INPUT2','INPUT3']. Please provide all "
     "required input(s)."),
    ("input_optional", {}, "expected number of inputs between 3 and 4 but got 0 inputs for model 'input_optional'. "
     "Got input(s) [], but missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required "
     "input(s)."),
    ("input_optional", {"INPUT3": [1.0]}, "expected number of inputs between 3 and 4 but got 1 inputs for model "
     "'input_optional'. Got input(s) ['INPUT3'], but missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please "
     "provide all required input(s)."),
], ids=["all-required-none", "all-required-one", "optional-none", "optional-only"])
def test_missing_required_input_has_tritons_text(server: Server, protocol: str, model: str,
                                                 values: dict[str, list[float]], text: str) -> None:
    with pytest.raises(InferenceServerException) as raised:
        _infer(server, protocol, model, values)
    assert raised.value.message() == text
    assert raised.value.status() == ("StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400")


def test_initializers_are_optional_inputs_only_where_declared(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        declared = client.get_model_config("input_optional").config.input
        assert [(t.name, t.optional) for t in declared] == [("INPUT0", False), ("INPUT1", False), ("INPUT2", False),
                                                            ("INPUT3", True)]
        # auto-complete leaves an initializer out, as Triton's onnxruntime backend does
        metadata = client.get_model_metadata("initializers_not_completed")
        assert [t.name for t in metadata.inputs] == ["INPUT0", "INPUT1", "INPUT2"]
        assert not client.is_model_ready("initializer_not_marked")
        reasons = {m.name: m.reason for m in client.get_model_repository_index().models}
    assert reasons["initializer_not_marked"] == (
        "inputs ['INPUT3'] have an initializer in the "
        "model: the configuration must mark them 'optional: true'")
    values = {"INPUT0": [1.0], "INPUT1": [2.0], "INPUT2": [3.0]}
    np.testing.assert_array_equal(_infer(server, "http", "initializers_not_completed", values), [106.0])

