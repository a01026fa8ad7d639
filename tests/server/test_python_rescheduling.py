"""Request rescheduling of python models (Triton's python_backend README, "Request Rescheduling"; the
models of Triton's qa/L0_backend_python/request_rescheduling and qa/L0_iterative_sequence), through a
real server and unmodified tritonclient: ``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``
under ``sequence_batching { iterative_sequence: true }`` runs the request again (same id, inputs and
sequence, START cleared), for decoupled models and models answered once; elsewhere the request fails
with Triton's core text."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from helpers import PYTHON_MODES, Server, add_python_model, python_mode, start_server

IO = '''
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
'''
SEEN_IO = '''
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }, { name: "SEEN", data_type: TYPE_STRING, dims: [3] }]
'''
ADDSUB_IO = '''
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [16] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [16] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [16] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [16] }]
'''
TEXT_OUT = '''
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [1] }]
'''
DECOUPLED = "model_transaction_policy { decoupled: true }\n"
ITERATIVE = "sequence_batching { iterative_sequence: true }\n"
# a decoupled model that gives each request back twice and answers on its third execute, with what each
# execute saw of the request (its id, correlation id, flags and input)
TWICE = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.seen = {}

        def execute(self, requests):
            for request in requests:
                value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                key = request.request_id()
                self.seen.setdefault(key, []).append(f"{key}/{request.correlation_id()}/{request.flags()}/{value}")
                if len(self.seen[key]) < 3:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    continue
                seen = self.seen.pop(key)
                request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value + len(seen)], np.int32)),
                    pb_utils.Tensor("SEEN", np.array([s.encode() for s in seen], np.object_))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
# Triton's qa/python_models/iterative_sequence (and the README's example): IN = N responses, N-1 ... 0
GENERATIVE = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.remaining_response = 0
            self.reset_flag = True

        def execute(self, requests):
            for request in requests:
                in_input = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if self.reset_flag:
                    self.remaining_response = in_input[0]
                    self.reset_flag = False
                response_sender = request.get_response_sender()
                self.remaining_response -= 1
                out_output = pb_utils.Tensor("OUT", np.array([self.remaining_response], np.int32))
                response = pb_utils.InferenceResponse(output_tensors=[out_output])
                if self.remaining_response <= 0:
                    response_sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    self.reset_flag = True
                else:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    response_sender.send(response)
            return None
'''
# Triton's qa/python_models/request_rescheduling_addsub: the first request is given back once
ADDSUB = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.idx = 0

        def execute(self, requests):
            responses = []
            for request in requests:
                in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", in_0 + in_1),
                                                                      pb_utils.Tensor("OUTPUT1", in_0 - in_1)])
                if self.idx == 0:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    responses.append(None)
                    self.idx += 1
                else:
                    responses.append(response)
            return responses
'''
# Triton's qa/python_models/wrong_return_type: a response returned for a rescheduled request
WRONG_RETURN_TYPE = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                out = pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
'''
# a model answered once that gives its request back without an iterative sequence
ONCE = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return [None for _ in requests]
'''
# Triton's qa/python_models/bls_request_rescheduling: both rescheduling models called through BLS
BLS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN")
                streamed = pb_utils.InferenceRequest(model_name="generative", inputs=[value],
                                                     requested_output_names=["OUT"]).exec(decoupled=True)
                seen = [int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]) if not r.has_error()
                        else r.error().message() for r in streamed if r.has_error() or r.output_tensors()]
                ones = pb_utils.Tensor("INPUT0", np.ones(16, np.float32))
                once = pb_utils.InferenceRequest(model_name="addsub", inputs=[ones, pb_utils.Tensor("INPUT1", ones.as_numpy())],
                                                 requested_output_names=["OUTPUT0"]).exec()
                total = once.error().message() if once.has_error() else float(
                    pb_utils.get_output_tensor_by_name(once, "OUTPUT0").as_numpy().sum())
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([f"{seen}|{total}".encode()], np.object_))]))
            return responses
'''
NOT_CONFIGURED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                  "configured to handle such a flag.")


def _repository(root: Path) -> Path:
    repository = root / "models"
    add_python_model(repository, "twice", SEEN_IO + DECOUPLED + ITERATIVE, TWICE)
    add_python_model(repository, "generative", IO + DECOUPLED + ITERATIVE, GENERATIVE)
    add_python_model(repository, "generative_dynamic", IO + DECOUPLED + "dynamic_batching {}\n", GENERATIVE)
    add_python_model(repository, "generative_direct", IO + DECOUPLED + "sequence_batching { direct {} }\n",
                     GENERATIVE)
    add_python_model(repository, "addsub", ADDSUB_IO + ITERATIVE, ADDSUB)
    add_python_model(repository, "wrong_return_type", IO + ITERATIVE, WRONG_RETURN_TYPE)
    add_python_model(repository, "once", IO, ONCE)
    add_python_model(repository, "bls", TEXT_OUT, BLS)
    return repository


@pytest.fixture(scope="module", params=PYTHON_MODES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("python_rescheduling")
    running = start_server(_repository(root), root / "logs", *python_mode(request.param))
    yield running
    assert running.stop() == 0


def _input(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def _stream(server: Server, model: str, value: int, count: int, **sequence: object) -> list[tuple[object, object]]:
    """``count`` results of one request on a gRPC stream: (result, error) pairs."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, [_input(value)], **sequence)  # type: ignore[arg-type]
        return [results.get(timeout=30) for _ in range(count)]
    finally:
        client.stop_stream()
        client.close()


def test_a_decoupled_model_sees_the_same_request_again_until_it_answers(server: Server) -> None:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("twice", [_input(5)], request_id="first")
        client.async_stream_infer("twice", [_input(9)], request_id="second", sequence_id=77, sequence_start=True)
        answers = {}
        for _ in range(2):
            result, error = results.get(timeout=30)
            assert error is None, error
            answers[result.get_response().id] = (int(result.as_numpy("OUT")[0]),
                                                  [s.decode() for s in result.as_numpy("SEEN")])
        # no sequence id: the server gave the request one and START, then cleared START (Triton's IterativeSequencer)
        value, seen = answers["first"]
        assert value == 8
        corrid = seen[0].split("/")[1]
        assert corrid != "0" and seen == [f"first/{corrid}/1/5", f"first/{corrid}/0/5", f"first/{corrid}/0/5"], seen
        assert answers["second"] == (12, ["second/77/1/9", "second/77/0/9", "second/77/0/9"])
        # the sequence ended when its request was answered: the id must START again
        client.async_stream_infer("twice", [_input(1)], sequence_id=77)
        _, error = results.get(timeout=30)
        assert "must specify the START flag on the first request of the sequence" in str(error), error
    finally:
        client.stop_stream()
        client.close()


def test_an_iterative_sequence_generates_its_responses_by_rescheduling(server: Server) -> None:
    for count in (3, 1, 4):
        results = _stream(server, "generative", count, count)
        assert [error for _, error in results] == [None] * count
        assert [int(result.as_numpy("OUT")[0]) for result, _ in results] == list(range(count - 1, -1, -1))
    # REST generate_stream (Triton's qa/L0_iterative_sequence): an event per response
    reply = httpx.post(f"http://{server.http_url}/v2/models/generative/generate_stream", json={"IN": 2}, timeout=30)
    assert reply.status_code == 200
    events = [json.loads(chunk.removeprefix("data: ")) for chunk in reply.text.split("\n\n") if chunk]
    assert [event["OUT"] for event in events] == [1, 0], reply.text


def test_a_model_answered_once_returns_none_for_its_rescheduled_request(server: Server) -> None:
    in0, in1 = np.random.randn(16).astype(np.float32), np.random.randn(16).astype(np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [16], "FP32"), grpcclient.InferInput("INPUT1", [16], "FP32")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    with grpcclient.InferenceServerClient(server.url) as client:
        result = client.infer("addsub", inputs)
        assert np.array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
        assert np.array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
        statistics = client.get_inference_statistics("addsub", as_json=True)["model_stats"][0]
    assert (int(statistics["inference_count"]), int(statistics["execution_count"])) == (1, 2), statistics


def test_a_response_returned_for_a_rescheduled_request_is_tritons_error(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("wrong_return_type", [_input(1)])
    assert ("Expected a None object in the execute function return list for reschduled request, found type "
            "'InferenceResponse'.") in raised.value.message(), raised.value


def test_rescheduling_without_an_iterative_sequence_fails_with_tritons_text(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("once", [_input(1)])
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message() == NOT_CONFIGURED
    # decoupled under the default scheduler and a sequence batcher without iterative_sequence (Triton's
    # qa/L0_iterative_sequence): the response sent before, then the error as the final response
    for model, sequence in (("generative_dynamic", {}), ("generative_direct", {"sequence_id": 5, "sequence_start": True})):
        (first, none), (_, error) = _stream(server, model, 2, 2, **sequence)
        assert none is None and int(first.as_numpy("OUT")[0]) == 1  # type: ignore[attr-defined]
        assert NOT_CONFIGURED in str(error), (model, error)


def test_business_logic_scripting_reaches_rescheduling_models(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        text = client.infer("bls", [_input(3)]).as_numpy("OUT")[0].decode()
    assert text == "[2, 1, 0]|32.0", text
