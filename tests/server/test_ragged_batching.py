"""Ragged batching (Triton's ``ragged_batching.md``; its ``qa/L0_batch_input``): requests of different
lengths merge into one execution without padding, through a real server and unmodified tritonclient."""

from __future__ import annotations

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import add_model, make_model, start_server

LENGTHS = (2, 4, 1, 3)  # the lengths of Triton's batch_input_test.py


def _ragged_model() -> object:
    """OUTPUT = RAGGED * 2 (1-D, the batch's elements concatenated); ACC = the batch input INDEX (each
    request's end offset, BATCH_ACCUMULATED_ELEMENT_COUNT) repeated once per request: [requests, requests]."""
    shape_row = helper.make_tensor("row", TensorProto.INT64, [2], [1, -1])
    shape_col = helper.make_tensor("col", TensorProto.INT64, [2], [-1, 1])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [
        helper.make_node("Mul", ["RAGGED", "two"], ["OUTPUT"]),
        helper.make_node("Reshape", ["INDEX", "row"], ["index_row"]),
        helper.make_node("Reshape", ["INDEX", "col"], ["index_col"]),
        helper.make_node("Mul", ["index_col", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["ones"]),
        helper.make_node("Mul", ["ones", "index_row"], ["ACC"]),
    ]
    model = make_model(nodes, [("RAGGED", TensorProto.FLOAT, [None]), ("INDEX", TensorProto.FLOAT, [None])],
                       [("OUTPUT", TensorProto.FLOAT, [None]), ("ACC", TensorProto.FLOAT, [None, None])])
    model.graph.initializer.extend([shape_row, shape_col, two, helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
                                    helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return model


RAGGED_CONFIG = """max_batch_size: 8
input [{ name: "RAGGED" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true }]
output [{ name: "OUTPUT" data_type: TYPE_FP32 dims: [-1] }, { name: "ACC" data_type: TYPE_FP32 dims: [-1] }]
batch_input [{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_FP32 source_input: "RAGGED" }]
batch_output [{ target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "RAGGED" }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""


def _kinds_model() -> object:
    """Each batch input repeated once per request ([requests, n]: a request's row is the whole batch input)."""
    names = ("COUNT", "ZERO", "MAX", "FLAT")
    nodes = [helper.make_node("Reshape", ["COUNT_IN", "col"], ["count_col"]),
             helper.make_node("Mul", ["count_col", "zero"], ["zeros"]),
             helper.make_node("Add", ["zeros", "one"], ["ones"])]
    for n in names:
        nodes.append(helper.make_node("Reshape", [f"{n}_IN", "row"], [f"{n}_row"]))
        nodes.append(helper.make_node("Mul", ["ones", f"{n}_row"], [f"{n}_OUT"]))
    nodes.append(helper.make_node("Identity", ["RAGGED"], ["ECHO"]))
    model = make_model(nodes, [("RAGGED", TensorProto.FLOAT, [None])] + [(f"{n}_IN", TensorProto.INT32, [None]) for n in names],
                       [("ECHO", TensorProto.FLOAT, [None])] + [(f"{n}_OUT", TensorProto.INT32, [None, None]) for n in names])
    model.graph.initializer.extend([helper.make_tensor("row", TensorProto.INT64, [2], [1, -1]),
                                    helper.make_tensor("col", TensorProto.INT64, [2], [-1, 1]),
                                    helper.make_tensor("zero", TensorProto.INT32, [], [0]),
                                    helper.make_tensor("one", TensorProto.INT32, [], [1])])
    return model


KINDS_CONFIG = """max_batch_size: 8
input [{ name: "RAGGED" data_type: TYPE_FP32 dims: [-1, -1] allow_ragged_batch: true }]
output [{ name: "ECHO" data_type: TYPE_FP32 dims: [-1, -1] }""" + "".join(
    f', {{ name: "{n}_OUT" data_type: TYPE_INT32 dims: [-1] }}' for n in ("COUNT", "ZERO", "MAX", "FLAT")) + """]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT_IN" data_type: TYPE_INT32 source_input: "RAGGED" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ZERO_IN" data_type: TYPE_INT32 source_input: "RAGGED" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX_IN" data_type: TYPE_INT32 source_input: "RAGGED" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT_IN" data_type: TYPE_INT32 source_input: "RAGGED" }
]
batch_output [{ target_name: "ECHO" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "RAGGED" }]
"""


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    add_model(repository, "ragged", _ragged_model(),
              RAGGED_CONFIG + "dynamic_batching { max_queue_delay_microseconds: 2000000 }")
    add_model(repository, "ragged_direct", _ragged_model(), RAGGED_CONFIG)
    add_model(repository, "kinds", _kinds_model(), KINDS_CONFIG)
    # a ragged input may not be optional (Triton's onnxruntime backend)
    add_model(repository, "bad_optional", _kinds_model(), KINDS_CONFIG.replace("allow_ragged_batch: true",
                                                                             "allow_ragged_batch: true optional: true"))
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                          "--load-model", "*", "--exit-on-error=false")
    yield server
    assert server.stop() == 0


def _ragged_input(length: int) -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("RAGGED", [1, length], "FP32")
    tensor.set_data_from_numpy(np.full((1, length), length, np.float32))
    return [tensor]


def _stats(server, model: str) -> tuple[int, int]:
    with grpcclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics(model).model_stats[0]
    return stats.inference_count, stats.execution_count


def test_requests_of_different_lengths_batch_without_padding(ragged_server) -> None:
    # one stream keeps the requests in order, as Triton's batch_input_test.py sends them
    answers: queue.Queue[object] = queue.Queue()
    with grpcclient.InferenceServerClient(ragged_server.url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for length in LENGTHS:
            tensor = grpcclient.InferInput("RAGGED", [1, length], "FP32")
            tensor.set_data_from_numpy(np.full((1, length), length, np.float32))
            client.async_stream_infer("ragged", [tensor])
        results = [answers.get(timeout=30) for _ in LENGTHS]
        client.stop_stream()
    assert all(isinstance(r, grpcclient.InferResult) for r in results), results
    for length, result in zip(LENGTHS, results, strict=True):
        assert isinstance(result, grpcclient.InferResult)
        # BATCH_SCATTER_WITH_INPUT_SHAPE: each request gets its own elements, in its input's shape
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), np.full((1, length), 2 * length, np.float32))
        # BATCH_ACCUMULATED_ELEMENT_COUNT of the one merged batch, as Triton's test expects it
        np.testing.assert_array_equal(result.as_numpy("ACC"), np.array([[2, 6, 7, 10]], np.float32))
    assert _stats(ragged_server, "ragged") == (4, 1)


def test_concurrent_clients_each_get_their_own_slice(ragged_server) -> None:
    async def run() -> list[aioclient.InferResult]:
        async with aioclient.InferenceServerClient(ragged_server.url) as client:
            return list(await asyncio.gather(*(client.infer("ragged", _ragged_input(n)) for n in LENGTHS)))

    before = _stats(ragged_server, "ragged")
    results = asyncio.run(run())
    for length, result in zip(LENGTHS, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), np.full((1, length), 2 * length, np.float32))
        offsets = result.as_numpy("ACC")[0]  # where each request ends: its own length is one of the steps
        assert offsets[-1] == sum(LENGTHS) and length in np.diff(offsets, prepend=0)
    after = _stats(ragged_server, "ragged")
    assert (after[0] - before[0], after[1] - before[1]) == (4, 1)


def test_http_client_and_a_request_alone(ragged_server) -> None:
    with httpclient.InferenceServerClient(ragged_server.http_url) as client:
        tensor = httpclient.InferInput("RAGGED", [1, 5], "FP32")
        tensor.set_data_from_numpy(np.arange(5, dtype=np.float32).reshape(1, 5))
        result = client.infer("ragged_direct", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), np.arange(5, dtype=np.float32).reshape(1, 5) * 2)
    np.testing.assert_array_equal(result.as_numpy("ACC"), np.array([[5]], np.float32))


def test_the_other_batch_input_kinds(ragged_server) -> None:
    with grpcclient.InferenceServerClient(ragged_server.url) as client:
        tensor = grpcclient.InferInput("RAGGED", [2, 3, 1], "FP32")
        tensor.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3, 1))
        result = client.infer("kinds", [tensor])
        metadata = client.get_model_metadata("kinds", as_json=True)
    np.testing.assert_array_equal(result.as_numpy("ECHO"), np.arange(6, dtype=np.float32).reshape(2, 3, 1))
    np.testing.assert_array_equal(result.as_numpy("COUNT_OUT"), [[6]])
    np.testing.assert_array_equal(result.as_numpy("ZERO_OUT"), [[0, 6]])
    assert result.as_numpy("MAX_OUT").shape == (1, 6)
    np.testing.assert_array_equal(result.as_numpy("FLAT_OUT"), [[3, 1, 3, 1]])  # each row's shape [3, 1]
    assert [i["name"] for i in metadata["inputs"]] == ["RAGGED"]  # batch inputs are the server's own


def test_a_ragged_optional_input_does_not_load(ragged_server) -> None:
    with grpcclient.InferenceServerClient(ragged_server.url) as client:
        with pytest.raises(InferenceServerException, match="not supported for optional input"):
            client.load_model("bad_optional")
