"""Triton's generate extension (``/generate``, ``/generate_stream``) through a real server and an
SSE client (httpx, reading the stream as it comes), on a decoupled mock LLM with the interface of
Triton's ``qa/L0_http/generate_models/mock_llm`` and the cases of ``qa/L0_http/generate_endpoint_test.py``:
JSON keys to input tensors and parameters, responses back to keys, the SSE framing and the error
event, one versus zero or many responses, errors before inference as JSON, responses streamed as
they are sent, and a client that disconnects mid-stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from helpers import Server, add_python_model, http_request, start_server, wait_until

# our own mock with mock_llm's interface: PROMPT echoed as TEXT, REPETITION times (STREAM true) or once;
# parameters DELAY (s between responses), FAIL_LAST (an error response last), OUTPUT_0_DIM (an empty TEXT)
MOCK_LLM = '''
    import json
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                options = json.loads(request.parameters())
                sender = request.get_response_sender()
                prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
                text = np.array([], dtype=np.object_) if options.get("OUTPUT_0_DIM") else prompt
                response = pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)])
                if not pb_utils.get_input_tensor_by_name(request, "STREAM").as_numpy().reshape(-1)[0]:
                    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                for sent in range(options.get("REPETITION", 1)):
                    if options.get("DELAY"):
                        time.sleep(options["DELAY"])
                    if sender.is_cancelled():
                        pb_utils.Logger.log_info(f"mock_llm cancelled after {sent} responses")
                        break
                    sender.send(response)
                last = pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")) \\
                    if options.get("FAIL_LAST") else None
                sender.send(last, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
CONFIG = '''max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
  { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] },
  { name: "input_ids" data_type: TYPE_INT32 dims: [ 1, -1 ] optional: true }
]
output [{ name: "TEXT" data_type: TYPE_STRING dims: [ 1, -1 ] }]
instance_group [{ count: 2 kind: KIND_MODEL }]'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("generate")
    add_python_model(root / "models", "mock_llm", CONFIG, MOCK_LLM)
    running = start_server(root / "models", root / "logs")
    yield running
    assert running.stop() == 0


def _post(server: Server, route: str, body: Any, model: str = "mock_llm") -> httpx.Response:
    """A generate route's reply to ``body`` as JSON, or to a ``str`` body as it is (a malformed one)."""
    if isinstance(body, str):
        return http_request(server, f"/v2/models/{model}/{route}", content=body.encode())
    return http_request(server, f"/v2/models/{model}/{route}", body=body)


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    """The events of a complete SSE body, checking Triton's framing: ``data: <JSON>`` and a blank line."""
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    body = response.text
    assert body == "" or body.endswith("\n\n"), body
    events = [chunk for chunk in body.split("\n\n") if chunk]
    assert all(chunk.startswith("data: ") and "\n" not in chunk for chunk in events), body
    return [json.loads(chunk.removeprefix("data: ")) for chunk in events]


def test_generate_maps_keys_to_tensors_and_back(server: Server) -> None:
    reply = _post(server, "generate", {"PROMPT": "hello world", "STREAM": False, "input_ids": [100, 200], "id": "42"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"id": "42", "model_name": "mock_llm", "model_version": "1", "TEXT": "hello world"}
    # no id, or an empty one: no id in the answer
    assert "id" not in _post(server, "generate", {"PROMPT": "a", "STREAM": False}).json()
    assert "id" not in _post(server, "generate", {"PROMPT": "a", "STREAM": False, "id": ""}).json()
    # an output with no element is an empty array
    empty = _post(server, "generate", {"PROMPT": "a", "STREAM": False, "OUTPUT_0_DIM": True})
    assert empty.json()["TEXT"] == []


def test_generate_stream_sends_each_response_as_an_event(server: Server) -> None:
    reply = _post(server, "generate_stream", {"PROMPT": ["hello world"], "STREAM": True, "REPETITION": 3})
    assert reply.status_code == 200
    assert [event["TEXT"] for event in _events(reply)] == ["hello world"] * 3
    # the keys of "parameters" map as the top-level ones do
    nested = _post(server, "generate_stream", {"PROMPT": ["x"], "STREAM": True, "parameters": {"REPETITION": 2}})
    assert len(_events(nested)) == 2
    # zero responses: an empty stream
    none = _post(server, "generate_stream", {"PROMPT": ["x"], "STREAM": True, "REPETITION": 0})
    assert none.status_code == 200 and _events(none) == []


def test_a_model_error_is_an_error_event_with_the_first_events_status(server: Server) -> None:
    first = _post(server, "generate_stream", {"PROMPT": ["x"], "STREAM": True, "REPETITION": 0, "FAIL_LAST": True})
    assert first.status_code == 500
    assert _events(first) == [{"error": "An Error Occurred"}]
    later = _post(server, "generate_stream", {"PROMPT": ["x"], "STREAM": True, "REPETITION": 1, "FAIL_LAST": True})
    assert later.status_code == 200  # the status went out with the first event
    assert [e.get("TEXT", e.get("error")) for e in _events(later)] == ["x", "An Error Occurred"]


def test_generate_wants_exactly_one_response(server: Server) -> None:
    assert _post(server, "generate", {"PROMPT": "x", "STREAM": True}).status_code == 200  # one, then the flag alone
    for repetitions in (0, 2):
        reply = _post(server, "generate", {"PROMPT": "x", "STREAM": True, "REPETITION": repetitions})
        assert reply.status_code == 500
        assert "generate expects model to produce exactly 1 response" in reply.json()["error"]


@pytest.mark.parametrize(("body", "message"), [
    ({}, "expected number of inputs between 2 and 3 but got 0"),
    ({"abc": 123}, "expected number of inputs between 2 and 3 but got 0"),
    ({"STREAM": False, "other": "param"}, "expected number of inputs between 2 and 3 but got 1"),
    ({"PROMPT": 123, "STREAM": False}, "attempt to access JSON non-string as string"),
    ({"PROMPT": "hello", "STREAM": "false"}, "attempt to access JSON non-boolean as boolean"),
    ({"STREAM": 123, "PROMPT": True}, "attempt to access JSON non-boolean as boolean"),  # in order
    ('{"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate"}', "input 'PROMPT' already exists in request"),
    ({"PROMPT": "x", "STREAM": True, "PARAMS": {"P": 0}}, "parameter 'PARAMS' has invalid type"),
    ({"PROMPT": {"USER": "hello"}, "STREAM": True}, "attempt to access JSON non-string as string"),
    ({"PROMPT": ["x"], "STREAM": True, "parameters": 1}, "Expected JSON object for keyword: 'parameters'"),
    ({"PROMPT": ["x"], "STREAM": True, "parameters": {"nested": {"twice": 1}}},
     "Converting keyword: 'parameters': parameter 'nested' has invalid type."),
    ({"PROMPT": ["a", "b"], "STREAM": True}, "The schema can not convert input 'PROMPT' to tensor with proper shape"),
    ("[1, 2]", "the generate request must be a JSON object"),
])
def test_a_request_that_fails_before_inference_is_a_json_error(server: Server, body: Any, message: str) -> None:
    for route in ("generate", "generate_stream"):
        reply = _post(server, route, body)
        assert reply.status_code == 400, reply.text
        assert reply.headers["content-type"] == "application/json"  # never an event stream
        assert message in reply.json()["error"]
    unknown = _post(server, "generate_stream", {"PROMPT": "x"}, model="no_such_model")
    assert unknown.status_code == 404 and "no_such_model" in unknown.json()["error"]


def test_responses_are_streamed_as_they_are_sent(server: Server) -> None:
    arrivals = []
    body = {"PROMPT": ["x"], "STREAM": True, "REPETITION": 3, "DELAY": 0.5}
    with httpx.stream("POST", f"http://{server.http_url}/v2/models/mock_llm/generate_stream", json=body,
                      timeout=60) as reply:
        began = time.monotonic()
        for line in reply.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - began)
    assert len(arrivals) == 3
    assert arrivals[1] - arrivals[0] > 0.3 and arrivals[2] - arrivals[1] > 0.3, arrivals  # not held to the end


def test_a_client_that_disconnects_cancels_the_stream(server: Server) -> None:
    body = {"PROMPT": ["x"], "STREAM": True, "REPETITION": 1000, "DELAY": 0.05}
    with httpx.stream("POST", f"http://{server.http_url}/v2/models/mock_llm/generate_stream", json=body,
                      timeout=60) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: ")  # then the client closes the connection
    line = wait_until(lambda: next((line for line in server.log().splitlines() if "mock_llm cancelled after" in line),
                                   None), "the model saw its request cancelled")
    assert int(line.rsplit("after ", 1)[1].split()[0]) < 1000
    assert http_request(server, "/v2/health/live").status_code == 200
    again = _post(server, "generate", {"PROMPT": "still here", "STREAM": False})
    assert again.json()["TEXT"] == "still here"
