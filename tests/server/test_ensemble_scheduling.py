"""Ensembles run as Triton's ensemble scheduler runs them, through a real server and unmodified
tritonclient (gRPC and HTTP): a batch dim of 1 added and stripped between steps with and without
batching (``qa/L0_infer_zero``, zero-sized and variable dims), only the steps the requested
outputs need (``qa/L0_simple_ensemble`` ``test_ensemble_add_sub_one_output``, seen in
ModelStatistics), and the ``sequence_*`` response parameters (``test_ensemble_sequence_flags``)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from helpers import Server, add_model, make_model, start_server

CLIENTS = {"grpc": grpcclient, "http": httpclient}


def _identity(repository: Path, name: str, rank: int, max_batch_size: int) -> None:
    """INPUT0 -> OUTPUT0, FP32 with ``rank`` variable dims (plus the batch dim when batching)."""
    shape = [None] * (rank + (max_batch_size > 0))
    dims = ", ".join(["-1"] * rank)
    add_model(repository, name, make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                                           [("INPUT0", TensorProto.FLOAT, shape)], [("OUTPUT0", TensorProto.FLOAT, shape)]),
              f'max_batch_size: {max_batch_size}\ninput [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}]\n'
              f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}]\n')


def _binary(repository: Path, name: str, op: str) -> None:
    """OUTPUT0 = INPUT0 <op> INPUT1, FP32 [batch, -1], max_batch_size 8."""
    shape = [None, None]
    add_model(repository, name, make_model([helper.make_node(op, ["INPUT0", "INPUT1"], ["OUTPUT0"])],
                                           [("INPUT0", TensorProto.FLOAT, shape), ("INPUT1", TensorProto.FLOAT, shape)],
                                           [("OUTPUT0", TensorProto.FLOAT, shape)]), "max_batch_size: 8")


def _ensemble(repository: Path, name: str, max_batch_size: int, rank: int, inputs: tuple[str, ...],
              outputs: tuple[str, ...], steps: list[tuple[str, dict[str, str], dict[str, str]]]) -> None:
    dims = ", ".join(["-1"] * rank)
    tensors = lambda names: ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {dims} ] }}' for n in names)  # noqa: E731
    body = []
    for model, input_map, output_map in steps:
        maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in input_map.items()]
        maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in output_map.items()]
        body.append(f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}')
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\ninput [ {tensors(inputs)} ]\n'
        f'output [ {tensors(outputs)} ]\nensemble_scheduling {{ step [ {", ".join(body)} ] }}\n')


def _chain(models: list[str]) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """INPUT -> models[0] -> models[1] -> ... -> OUTPUT."""
    names = ["INPUT", *(f"t{i}" for i in range(len(models) - 1)), "OUTPUT"]
    return [(m, {"INPUT0": names[i]}, {"OUTPUT0": names[i + 1]}) for i, m in enumerate(models)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("repo")
    _identity(repository, "nop_batch", 1, 8)
    _identity(repository, "nop_nobatch", 1, 0)
    _identity(repository, "nop_batch_2d", 2, 8)
    _identity(repository, "nop_nobatch_2d", 2, 0)
    # no batching -> batching -> no batching, and the other way round, in one and two variable dims
    _ensemble(repository, "zero_nobatch", 0, 1, ("INPUT",), ("OUTPUT",), _chain(["nop_nobatch", "nop_batch", "nop_nobatch"]))
    _ensemble(repository, "zero_batch", 8, 1, ("INPUT",), ("OUTPUT",), _chain(["nop_batch", "nop_nobatch", "nop_batch"]))
    _ensemble(repository, "zero_nobatch_2d", 0, 2, ("INPUT",), ("OUTPUT",),
              _chain(["nop_batch_2d", "nop_nobatch_2d", "nop_batch_2d"]))
    _ensemble(repository, "zero_batch_2d", 8, 2, ("INPUT",), ("OUTPUT",),
              _chain(["nop_nobatch_2d", "nop_batch_2d", "nop_nobatch_2d"]))
    _binary(repository, "twice_add", "Add")
    _binary(repository, "plus", "Add")
    _binary(repository, "minus", "Sub")
    # OUTPUT0 = 2 * INPUT0 + INPUT1 (two steps), OUTPUT1 = INPUT0 - INPUT1 (one step of its own)
    _ensemble(repository, "add_sub", 8, 1, ("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1"), [
        ("plus", {"INPUT0": "doubled", "INPUT1": "INPUT1"}, {"OUTPUT0": "OUTPUT0"}),
        ("twice_add", {"INPUT0": "INPUT0", "INPUT1": "INPUT0"}, {"OUTPUT0": "doubled"}),
        ("minus", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "OUTPUT1"}),
    ])
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def _client(server: Server, protocol: str):
    return CLIENTS[protocol].InferenceServerClient(server.url if protocol == "grpc" else server.http_url)


def _input(module, name: str, data: np.ndarray):
    tensor = module.InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


@pytest.mark.parametrize("protocol", CLIENTS)
@pytest.mark.parametrize(("model", "shape"), [
    ("zero_nobatch", [0]), ("zero_nobatch", [5]),  # [n] -> [1, n] into nop_batch -> [n] into nop_nobatch
    ("zero_batch", [1, 0]), ("zero_batch", [1, 3]),  # [1, n] -> [n] into nop_nobatch -> [1, n] into nop_batch
    ("zero_nobatch_2d", [0, 0]), ("zero_nobatch_2d", [2, 0]), ("zero_nobatch_2d", [3, 4]),
    ("zero_batch_2d", [1, 0, 2]), ("zero_batch_2d", [1, 2, 3]),
    ("zero_batch_2d", [4, 2, 3]),  # a batch of 4 is not stripped: refused by nop_nobatch_2d, as in Triton
])
def test_steps_with_and_without_batching_pass_tensors_as_triton_does(server: Server, protocol: str, model: str,
                                                                     shape: list[int]) -> None:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    module = CLIENTS[protocol]
    with _client(server, protocol) as client:
        if model == "zero_batch_2d" and shape[0] > 1:  # Triton strips only a batch of 1
            with pytest.raises(Exception, match=r"unexpected shape for input 'INPUT0' for model 'nop_nobatch_2d'"):
                client.infer(model, [_input(module, "INPUT", data)])
            return
        result = client.infer(model, [_input(module, "INPUT", data)])
    assert list(result.as_numpy("OUTPUT").shape) == shape
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), data)


def _counts(client: grpcclient.InferenceServerClient) -> dict[str, int]:
    return {m: client.get_inference_statistics(m).model_stats[0].inference_stats.success.count
            for m in ("add_sub", "twice_add", "plus", "minus")}


@pytest.mark.parametrize("protocol", CLIENTS)
def test_only_the_steps_the_requested_outputs_need_run(server: Server, protocol: str) -> None:
    a, b = np.array([[1.0, 2.0]], np.float32), np.array([[10.0, 20.0]], np.float32)
    module = CLIENTS[protocol]
    with grpcclient.InferenceServerClient(server.url) as stats, _client(server, protocol) as client:
        for wanted, ran in ((["OUTPUT0"], {"twice_add", "plus"}), (["OUTPUT1"], {"minus"}),
                            (["OUTPUT0", "OUTPUT1"], {"twice_add", "plus", "minus"})):
            before = _counts(stats)
            result = client.infer("add_sub", [_input(module, "INPUT0", a), _input(module, "INPUT1", b)],
                                  outputs=[module.InferRequestedOutput(name) for name in wanted])
            after = _counts(stats)
            assert {m for m in after if after[m] != before[m]} == ran | {"add_sub"}, wanted
            if "OUTPUT0" in wanted:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a + b)
            if "OUTPUT1" in wanted:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            for name in {"OUTPUT0", "OUTPUT1"} - set(wanted):
                assert result.as_numpy(name) is None


def test_an_ensemble_in_a_sequence_answers_with_the_sequence_flags(server: Server) -> None:
    a = np.ones((1, 2), np.float32)
    inputs = [_input(grpcclient, "INPUT0", a), _input(grpcclient, "INPUT1", a)]
    responses: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for i, (start, end) in enumerate([(True, False), (False, False), (False, True)]):
            client.async_stream_infer("add_sub", inputs, request_id=f"r{i}", sequence_id=1234,
                                      sequence_start=start, sequence_end=end,
                                      outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
        flags = {}
        for _ in range(3):
            result, error = responses.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            parameters = response.parameters
            flags[response.id] = (parameters["sequence_id"].int64_param, parameters["sequence_start"].bool_param,
                                  parameters["sequence_end"].bool_param)
        client.stop_stream()
        plain = client.infer("add_sub", inputs).get_response().parameters
    assert flags == {"r0": (1234, True, False), "r1": (1234, False, False), "r2": (1234, False, True)}
    # outside a sequence Triton's ensemble answers sequence_id 0 and both flags false
    assert (plain["sequence_id"].int64_param, plain["sequence_start"].bool_param, plain["sequence_end"].bool_param) == \
        (0, False, False)
    with httpclient.InferenceServerClient(server.http_url) as http:
        reply = http.infer("add_sub", [_input(httpclient, "INPUT0", a), _input(httpclient, "INPUT1", a)],
                           sequence_id="s-1", sequence_start=True)
    assert reply.get_response()["parameters"] == {"sequence_id": "s-1", "sequence_start": True, "sequence_end": False}
