"""Decoupled python models (Triton's ``model_transaction_policy { decoupled: true }``) through a real
server and unmodified tritonclient: zero, one and many responses per request on ModelStreamInfer,
each with its request id and ``triton_final_response``; an error response and an exception in
execute reported in-stream while the stream goes on; a stream cancelled in flight, which the model
sees; ModelInfer and REST infer refused with Triton's texts; statistics counting each request once
and each response by its index; and business logic scripting iterating a decoupled model's responses
(Triton's ``qa/L0_backend_python/decoupled``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import PYTHON_MODES, Server, add_python_model, python_mode, start_server, wait_until
from stream_client import StreamReader

# COUNT responses (OUT = 0, 1, ...), then the final flag; parameters: delay_ms between responses,
# together (the final flag on the last response), fail (an error response last), raise (execute raises)
REPEAT = '''
    import json
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
                options = json.loads(request.parameters())
                if options.get("raise"):
                    raise ValueError("Intentional Error")
                for index in range(count):
                    if sender.is_cancelled():
                        pb_utils.Logger.log_info(f"repeat cancelled after {index} responses")
                        break
                    time.sleep(options.get("delay_ms", 0) / 1000)
                    last = options.get("together") and index == count - 1
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("OUT", np.array([index], np.int32))]), flags=FINAL if last else 0)
                if options.get("together") and count:
                    continue
                if options.get("fail"):
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")), flags=FINAL)
                else:
                    sender.send(flags=FINAL)
            return None
'''
BLS_DECOUPLED = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            count = pb_utils.get_input_tensor_by_name(requests[0], "COUNT")
            total, responses = 0, 0
            for answer in pb_utils.InferenceRequest(model_name="repeat", inputs=[count],
                                                    requested_output_names=["OUT"]).exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                if answer.output_tensors():  # the last, empty response carries only the final flag
                    total += int(pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()[0])
                    responses += 1
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([total, responses], np.int32))])]
'''
COUNT = 'input [{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }]\n'


@pytest.fixture(scope="module", params=PYTHON_MODES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("decoupled")
    repository = root / "models"
    add_python_model(repository, "repeat", 'model_transaction_policy { decoupled: true }\n' + COUNT +
                     'output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]\ninstance_group [{ count: 2 }]', REPEAT)
    add_python_model(repository, "bls_decoupled", COUNT + 'output [{ name: "SUM" data_type: TYPE_INT32 dims: [ 2 ] }]',
                     BLS_DECOUPLED)
    running = start_server(repository, root / "logs", *python_mode(request.param))
    yield running
    assert running.stop() == 0


def _count(n: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], np.int32))
    return [tensor]


class Stream(StreamReader):
    """A stream of requests to ``repeat``, read in the order the responses come."""

    def send(self, n: int, request_id: str, empty_final: bool = False, **parameters) -> None:
        self.client.async_stream_infer("repeat", _count(n), request_id=request_id, parameters=parameters or None,
                                       enable_empty_final_response=empty_final)


def test_zero_one_and_many_responses_per_request(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send(3, "many")
        assert [stream.next() for _ in range(3)] == [("many", 0, False, None), ("many", 1, False, None),
                                                     ("many", 2, False, None)]
        stream.send(1, "one", together=True)  # the final flag comes with the one response
        assert stream.next() == ("one", 0, True, None)
        stream.send(0, "none")  # no response at all: the final flag alone is not sent by default
        stream.send(0, "flag only", empty_final=True)  # unless the request asks for it
        assert stream.next() == ("flag only", None, True, None)
        stream.send(2, "after")
        assert [stream.next()[:2] for _ in range(2)] == [("after", 0), ("after", 1)]
    finally:
        stream.close()
    assert stream.results.empty()


def test_errors_are_reported_in_stream_and_the_stream_goes_on(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send(1, "fails", fail=True)
        assert stream.next() == ("fails", 0, False, None)
        assert stream.next()[3] == "An Error Occurred"  # the model's error response, verbatim
        stream.send(1, "raises", **{"raise": True})
        message = stream.next()[3]
        assert message is not None and message.startswith("Failed to process the request(s) for model 'repeat_0_")
        assert message.endswith("message: ValueError: Intentional Error")
        stream.send(1, "still serving", together=True)
        assert stream.next() == ("still serving", 0, True, None)
    finally:
        stream.close()


def test_a_stream_cancelled_in_flight_stops_the_model(server: Server) -> None:
    stream = Stream(server)
    stream.send(1000, "long", delay_ms=20)
    assert stream.next()[:2] == ("long", 0)
    stream.close(cancel=True)  # the client cancels the call while responses are still coming
    line = wait_until(lambda: next((line for line in server.log().splitlines() if "repeat cancelled after" in line), None),
                      "the model saw its request cancelled")
    assert int(line.rsplit("after ", 1)[1].split()[0]) < 1000
    again = Stream(server)  # the instance serves again
    try:
        again.send(1, "next", together=True)
        assert again.next() == ("next", 0, True, None)
    finally:
        again.close()


def test_a_request_answered_once_is_refused_as_triton_refuses_it(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("repeat").model_stats[0].inference_stats.fail.count
        with pytest.raises(InferenceServerException) as raised:
            client.infer("repeat", _count(1))
        after = client.get_inference_statistics("repeat").model_stats[0].inference_stats.fail.count
    assert raised.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    assert str(raised.value.status()) == "StatusCode.UNIMPLEMENTED"
    assert after == before  # refused before it counts, as Triton's front end refuses it
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("repeat", [tensor])
    assert refused.value.status() == "501"


def test_statistics_count_requests_once_and_responses_by_index(server: Server, tmp_path: Path) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("repeat").model_stats[0]
        stream = Stream(server)
        try:
            stream.send(3, "counted", empty_final=True)
            assert [stream.next()[1] for _ in range(4)] == [0, 1, 2, None]
        finally:
            stream.close()
        # the execution is counted once execute has returned, which may come after the final response
        # (a stub process answers the execute after the responses its sender sent)
        after = wait_until(lambda: (lambda s: s if s.execution_count > before.execution_count else None)(
            client.get_inference_statistics("repeat").model_stats[0]), "the execution counted")
    assert after.inference_stats.success.count - before.inference_stats.success.count == 1
    assert after.execution_count - before.execution_count == 1

    def counts(stats, key: str) -> tuple[int, int]:
        response = stats.response_stats[key] if key in stats.response_stats else None
        return (response.success.count, response.empty_response.count) if response is not None else (0, 0)

    for key in ("0", "1", "2"):
        assert counts(after, key)[0] - counts(before, key)[0] == 1, key
    assert counts(after, "3")[1] - counts(before, "3")[1] == 1  # the final flag sent alone


def test_bls_to_a_decoupled_model_iterates_its_responses(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        result = client.infer("bls_decoupled", _count(4))
    np.testing.assert_array_equal(result.as_numpy("SUM"), [0 + 1 + 2 + 3, 4])
