"""Decoupled models as ensemble steps (Triton's python_backend ``decoupled_models.md``, "Decoupled
models in ensembles"; ``ensemble_scheduler.cc``) through a real server and unmodified tritonclient:
each response of a decoupled step flows on through the steps after it, and the ensemble, decoupled
itself (its config says so, as Triton's normalised config does), streams one response per response
over ModelStreamInfer and REST ``generate_stream``; steps before the decoupled one run once, and a
decoupled ensemble may be a step of another; ModelInfer on it is refused with Triton's text;
an error of the decoupled step reaches the stream; a cancelled stream cancels the step; and an
ensemble whose steps take inputs from different decoupled steps fails to load with Triton's text
(``qa/L0_model_config`` ``invalid_decoupled_branching``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from helpers import Server, add_python_model, pending, start_server, wait_pending, wait_until
from pbtxt import ensemble_step
from stream_client import StreamReader

# three responses (parameter count) OUT = IN * 10 + i, then the final flag alone; parameters: delay_ms between
# responses, together (the final flag on the third), fail (an error response after the first)
TRIPLE = '''
    import json
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                options = json.loads(request.parameters())
                count = options.get("count", 3)
                for index in range(count):
                    if sender.is_cancelled():
                        pb_utils.Logger.log_info(f"triple cancelled after {index} responses")
                        break
                    time.sleep(options.get("delay_ms", 0) / 1000)
                    last = options.get("together") and index == count - 1
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("OUT", np.array([value * 10 + index], np.int32))]), flags=FINAL if last else 0)
                    if options.get("fail"):
                        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")),
                                    flags=FINAL)
                        break
                else:
                    if not options.get("together"):
                        sender.send(flags=FINAL)
            return None
'''
# Y = X + 100 (+ Z when given)
PLUS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                y = pb_utils.get_input_tensor_by_name(request, "X").as_numpy() + 100
                z = pb_utils.get_input_tensor_by_name(request, "Z")
                if z is not None:
                    y = y + z.as_numpy()
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
            return responses
'''
ONE = 'data_type: TYPE_INT32 dims: [ 1 ]'


def _ensemble(repository, name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]],
              outputs: tuple[str, ...] = ("OUT",)) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    declared = ", ".join(f'{{ name: "{o}" {ONE} }}' for o in outputs)
    (folder / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: 0\ninput [ {{ name: "IN" {ONE} }} ]\noutput [ {declared} ]\n'
        f'ensemble_scheduling {{ step [ {", ".join(ensemble_step(*s) for s in steps)} ] }}\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ensemble_decoupled")
    repository = root / "models"
    add_python_model(repository, "triple", f'model_transaction_policy {{ decoupled: true }}\n'
                     f'input [{{ name: "IN" {ONE} }}]\noutput [{{ name: "OUT" {ONE} }}]\n'
                     'instance_group [{ count: 2 kind: KIND_CPU }]', TRIPLE)
    add_python_model(repository, "plus", f'input [{{ name: "X" {ONE} }}, {{ name: "Z" {ONE} optional: true }}]\n'
                     f'output [{{ name: "Y" {ONE} }}]', PLUS)
    # IN -> triple (three responses) -> plus, once per response -> OUT
    _ensemble(repository, "triple_plus", [("triple", {"IN": "IN"}, {"OUT": "tripled"}),
                                          ("plus", {"X": "tripled"}, {"Y": "OUT"})])
    # IN -> plus -> triple -> OUT: a step before the decoupled one runs once
    _ensemble(repository, "plus_triple", [("plus", {"X": "IN"}, {"Y": "plussed"}),
                                          ("triple", {"IN": "plussed"}, {"OUT": "OUT"})])
    # IN -> triple_plus (a decoupled ensemble as a step) -> plus, once per response -> OUT
    _ensemble(repository, "nested", [("triple_plus", {"IN": "IN"}, {"OUT": "streamed"}),
                                     ("plus", {"X": "streamed"}, {"Y": "OUT"})])
    # Triton's invalid_decoupled_branching_2: outputs of two decoupled steps cannot meet
    _ensemble(repository, "branching", [("triple", {"IN": "IN"}, {"OUT": "OUT"}),
                                        ("triple", {"IN": "IN"}, {"OUT": "OUT2"})], outputs=("OUT", "OUT2"))
    # a step fed by the ensemble input and by a decoupled step's output (invalid_decoupled_branching)
    _ensemble(repository, "mixed", [("triple", {"IN": "IN"}, {"OUT": "tripled"}),
                                    ("plus", {"X": "tripled", "Z": "IN"}, {"Y": "OUT"})])
    running = start_server(repository, root / "logs", "--model-control-mode", "explicit",
                           "--load-model", "triple_plus", "--load-model", "plus_triple", "--load-model", "nested")
    yield running
    assert running.stop() == 0


def _in(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return [tensor]


class Stream(StreamReader):
    """A stream of requests to the ensembles, read in the order the responses come."""

    def send(self, value: int, request_id: str, model: str = "triple_plus", **parameters: Any) -> None:
        self.client.async_stream_infer(model, _in(value), request_id=request_id, parameters=parameters or None,
                                       enable_empty_final_response=True)


def _with_outputs(answers: list[tuple[str, int | None, bool, str | None]]) -> list[tuple[str, int | None]]:
    return [(request_id, out) for request_id, out, _, error in answers if out is not None or error is not None]


def test_each_response_of_the_decoupled_step_runs_the_next_step(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send(4, "first")
        answers = stream.until_final()
        # plus applied to each of triple's responses; the final flag on the last or alone (as Triton, by timing)
        assert _with_outputs(answers) == [("first", 140), ("first", 141), ("first", 142)]
        assert all(not final for _, _, final, _ in answers[:-1]) and answers[-1][3] is None
        stream.send(5, "together", together=True)  # the final flag comes with the third response
        assert stream.until_final() == [("together", 150, False, None), ("together", 151, False, None),
                                        ("together", 152, True, None)]
        stream.send(6, "none", count=0)  # no response: the final flag alone
        assert stream.next() == ("none", None, True, None)
    finally:
        stream.close()
    assert stream.results.empty()


def test_steps_before_a_decoupled_step_run_once_and_decoupled_ensembles_nest(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send(1, "before", model="plus_triple", together=True)
        assert stream.until_final() == [("before", 1010, False, None), ("before", 1011, False, None),
                                        ("before", 1012, True, None)]
        stream.send(3, "nested", model="nested")
        answers = stream.until_final()
        assert _with_outputs(answers) == [("nested", 230), ("nested", 231), ("nested", 232)]
    finally:
        stream.close()
    with grpcclient.InferenceServerClient(server.url) as client:
        assert client.get_model_config("nested").config.model_transaction_policy.decoupled


def test_the_ensemble_is_decoupled_and_refuses_model_infer(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("triple_plus").config
        assert config.model_transaction_policy.decoupled  # Triton's normalised ensemble config
        assert not client.get_model_config("plus").config.model_transaction_policy.decoupled
        with pytest.raises(InferenceServerException) as refused:
            client.infer("triple_plus", _in(1))
    assert refused.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    assert str(refused.value.status()) == "StatusCode.UNIMPLEMENTED"
    reply = httpx.post(f"http://{server.http_url}/v2/models/triple_plus/infer", timeout=30,
                       json={"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]})
    assert reply.status_code == 501, reply.text


def test_an_error_of_the_decoupled_step_reaches_the_stream(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send(2, "fails", fail=True)
        answers = stream.until_final()
        assert answers[0] == ("fails", 120, False, None)
        assert answers[-1][3] == "An Error Occurred"  # the step's error response, as an error of the ensemble
        stream.send(3, "goes on", together=True)  # the stream and the ensemble serve on
        assert [out for _, out, _, _ in stream.until_final()] == [130, 131, 132]
    finally:
        stream.close()


def test_a_cancelled_stream_cancels_the_decoupled_step(server: Server) -> None:
    stream = Stream(server)
    stream.send(7, "long", count=1000, delay_ms=20)
    assert stream.next()[:2] == ("long", 170)
    wait_pending(server, "triple_plus", 1)
    wait_pending(server, "triple", 1)
    stream.close(cancel=True)
    line = wait_until(lambda: next((line for line in server.log().splitlines() if "triple cancelled after" in line), None),
                      "the decoupled step saw its request cancelled")
    assert int(line.rsplit("after ", 1)[1].split()[0]) < 1000
    for model in ("triple_plus", "triple", "plus"):  # no request is left in flight
        wait_until(lambda model=model: pending(server, model) == 0, f"no request of '{model}' in flight")
    again = Stream(server)  # nothing is left holding the steps' instances
    try:
        for attempt in range(3):
            again.send(attempt, f"again {attempt}", together=True)
            assert [out for _, out, _, _ in again.until_final()] == [attempt * 10 + 100 + i for i in range(3)]
    finally:
        again.close()


def test_generate_stream_sends_each_ensemble_response_as_an_event(server: Server) -> None:
    reply = httpx.post(f"http://{server.http_url}/v2/models/triple_plus/generate_stream", timeout=30,
                       content=json.dumps({"IN": [2]}))
    assert reply.status_code == 200, reply.text
    events = [json.loads(chunk.removeprefix("data: ")) for chunk in reply.text.split("\n\n") if chunk]
    assert [event["OUT"] for event in events] == [120, 121, 122]  # one element: a scalar, as Triton writes it
    assert {event["model_name"] for event in events} == {"triple_plus"}


@pytest.mark.parametrize("name, text", [
    ("branching", "in ensemble branching, step of model 'branching' receives inputs originated from different "
                  "decoupled models"),
    ("mixed", "in ensemble mixed, step of model 'plus' receives inputs originated from different decoupled models"),
])
def test_inputs_from_different_decoupled_steps_fail_the_load(server: Server, name: str, text: str) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as failed:
            client.load_model(name)
        assert not client.is_model_ready(name)
    assert failed.value.message().startswith(f"load failed for model '{name}': ")
    assert text in failed.value.message()
