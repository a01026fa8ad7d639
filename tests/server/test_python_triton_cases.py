"""Python-backend behaviours that Triton's own python_backend tests and examples rely on, through a
real server and unmodified tritonclient (gRPC and HTTP): a BLS model name given as bytes (the
``bls`` example), every ``TritonError`` code's status, an output answered with the datatype the
model produced (``bls_decoupled``), an empty BYTES output, ``async def execute`` overlapping and its
tasks outliving it (``qa/L0_backend_python/async_execute``), the response sender of a model answered
once (``qa/L0_backend_python/response_sender``), ``is_cancelled`` seen from a thread
(``qa/python_models/execute_cancel``), BLS from a thread and refused outside execute, relative
imports of the model's folder, and model code that reads ``sys.argv`` or raises ``SystemExit``."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import PYTHON_MODES, Server, add_python_model, client_for, infer_input, python_mode, start_server, wait_until

# Y = X * 2 (a BLS target)
DOUBLE = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
'''
# the bls example: the target model's name comes from a BYTES tensor, passed on as bytes
BLS_BYTES_NAME = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]  # bytes
                x = pb_utils.get_input_tensor_by_name(request, "X")
                answer = pb_utils.InferenceRequest(model_name=name, requested_output_names=[b"Y"], inputs=[x]).exec()
                if answer.has_error():
                    responses.append(pb_utils.InferenceResponse(error=answer.error()))
                else:
                    responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
            return responses
'''
# answers with TritonError(code=CODE)
ERROR_CODES = '''
    import triton_python_backend_utils as pb_utils

    CODES = [pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.INTERNAL, pb_utils.TritonError.NOT_FOUND,
             pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.UNAVAILABLE, pb_utils.TritonError.UNSUPPORTED,
             pb_utils.TritonError.ALREADY_EXISTS, pb_utils.TritonError.CANCELLED]


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                code = CODES[int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])]
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"code {int(code)}", code)))
            return responses
'''
# outputs of other numpy types than configured (TYPE_INT32 / TYPE_FP32), and an empty BYTES output
OTHER_TYPES = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("I", np.array([1, 2], np.int64)), pb_utils.Tensor("F", np.array([0.5], np.float16)),
                pb_utils.Tensor("S", np.array([], dtype=np.object_))]) for _ in requests]
'''
# decoupled async execute: sleeps WAIT seconds (asyncio), then answers from a task it started
ASYNC_DECOUPLED = '''
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    class TritonPythonModel:
        def initialize(self, args):
            self.tasks = set()

        async def execute(self, requests):
            waits = [float(pb_utils.get_input_tensor_by_name(r, "WAIT").as_numpy()[0]) for r in requests]
            await asyncio.gather(*(asyncio.sleep(w) for w in waits))
            for request, wait in zip(requests, waits):
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([wait], np.float32))]))

                async def later(sender=sender):
                    await asyncio.sleep(0.2)
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("OUT", np.array([-1.0], np.float32))]), flags=FINAL)

                task = asyncio.create_task(later())
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            return None
'''
# a model answered once that uses its response sender; MODE chooses how (see test_the_response_sender...)
SENDER = '''
    import asyncio
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    def response(value):
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([value], np.int32))])


    class TritonPythonModel:
        def initialize(self, args):
            self.tasks = set()

        async def execute(self, requests):
            answers = []
            for request in requests:
                mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
                sender = request.get_response_sender()
                answers.append(None)
                if mode == "final_only":
                    sender.send(flags=FINAL)
                elif mode == "two":
                    sender.send(response(1))
                    try:
                        sender.send(response(2))
                    except pb_utils.TritonModelException as err:
                        pb_utils.Logger.log_info(f"second send refused: {err}")
                    sender.send(flags=FINAL)
                elif mode == "sent_and_returned":
                    sender.send(response(1), flags=FINAL)
                    answers[-1] = response(2)
                elif mode == "thread":
                    def later(sender=sender):
                        time.sleep(0.3)
                        sender.send(response(3), flags=FINAL)
                    threading.Thread(target=later, daemon=True).start()
                elif mode == "task":
                    async def later(sender=sender):
                        await asyncio.sleep(0.3)
                        sender.send(response(4), flags=FINAL)
                    task = asyncio.create_task(later())
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                else:
                    answers[-1] = response(0)
            return answers
'''
# decoupled: a thread started by execute answers after it returned: with a BLS call to `double`,
# or, while the request is not cancelled, with a response every 0.1 s
THREADED_DECOUPLED = '''
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    class TritonPythonModel:
        def initialize(self, args):
            try:
                pb_utils.InferenceRequest(model_name="double", requested_output_names=["Y"],
                                          inputs=[pb_utils.Tensor("X", np.ones(1, np.float32))]).exec()
                self.in_initialize = "BLS ran"
            except Exception as err:
                self.in_initialize = str(err)

        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                threading.Thread(target=self.answer, args=(request.get_response_sender(), x), daemon=True).start()
            return None

        def answer(self, sender, x):
            time.sleep(0.1)  # execute has returned
            if x[0] >= 0:
                bls = pb_utils.InferenceRequest(model_name="double", requested_output_names=["Y"],
                                                inputs=[pb_utils.Tensor("X", x)]).exec()
                y = pb_utils.get_output_tensor_by_name(bls, "Y").as_numpy()
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("Y", y), pb_utils.Tensor("NOTE", np.array([self.in_initialize.encode()], np.object_))]),
                    flags=FINAL)
                return
            for index in range(600):
                if sender.is_cancelled():
                    pb_utils.Logger.log_info(f"[threaded] request cancelled after {index} responses")
                    return
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("Y", np.array([index], np.float32)),
                    pb_utils.Tensor("NOTE", np.array([b""], np.object_))]))
                time.sleep(0.1)
'''
# relative imports of the model's own folder (its helper.py differs per model)
RELATIVE = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    from . import helper
    from .helper import WHO


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("WHO", np.array([helper.who().encode(), WHO.encode()], np.object_))]) for _ in requests]
'''
# model code that reads sys.argv and runs unittest.main in initialize; EXIT raises SystemExit in execute
ARGV = '''
    import json
    import sys
    import unittest

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class Checks(unittest.TestCase):
        def test_arithmetic(self):
            self.assertEqual(1 + 1, 2)


    class TritonPythonModel:
        def initialize(self, args):
            argv = list(sys.argv)
            program = unittest.main(__name__, exit=False, verbosity=0)  # as Triton's qa models run their checks
            self.report = json.dumps({"argv": argv, "ran": program.result.testsRun,
                                      "ok": program.result.wasSuccessful()})

        def execute(self, requests):
            for request in requests:
                if pb_utils.get_input_tensor_by_name(request, "EXIT").as_numpy()[0]:
                    sys.exit(3)
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("REPORT", np.array([self.report.encode()], np.object_))]) for _ in requests]
'''
EXIT_IN_INITIALIZE = '''
    import sys


    class TritonPythonModel:
        def initialize(self, args):
            sys.exit("no GPU here")

        def execute(self, requests):
            return []
'''
X = 'input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
Y = 'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
ONE = 'instance_group [{ kind: KIND_CPU count: 1 }]\n'
DECOUPLED = 'model_transaction_policy { decoupled: true }\n'
LOADED = ("double", "bls_bytes_name", "error_codes", "other_types", "async_decoupled", "sender", "threaded",
          "relative_a", "relative_b", "argv")
# TritonError code -> (gRPC status, HTTP status) as Triton 2.51 reports it (src/grpc/grpc_utils.cc and
# HttpCodeFromError in triton-inference-server/server); CANCELLED is 499 here over HTTP (Triton: 400)
STATUSES = [("UNKNOWN", 400), ("INTERNAL", 500), ("NOT_FOUND", 404), ("INVALID_ARGUMENT", 400), ("UNAVAILABLE", 503),
            ("UNIMPLEMENTED", 501), ("ALREADY_EXISTS", 400), ("CANCELLED", 499)]


def _repository(root: Path) -> Path:
    repository = root / "models"
    add_python_model(repository, "double", X + Y + ONE, DOUBLE)
    add_python_model(repository, "bls_bytes_name", 'input [{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }]\n'
                     + X + Y + ONE, BLS_BYTES_NAME)
    add_python_model(repository, "error_codes", 'input [{ name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] }]\n' + Y + ONE,
                     ERROR_CODES)
    add_python_model(repository, "other_types", 'output [{ name: "I" data_type: TYPE_INT32 dims: [ -1 ] },'
                     '{ name: "F" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "S" data_type: TYPE_STRING dims: [ -1 ] }]\n'
                     + ONE, OTHER_TYPES)
    add_python_model(repository, "async_decoupled", 'input [{ name: "WAIT" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
                     'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]\n' + ONE + DECOUPLED, ASYNC_DECOUPLED)
    add_python_model(repository, "sender", 'input [{ name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }]\n'
                     'output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n' + ONE, SENDER)
    add_python_model(repository, "threaded", X + Y + 'output [{ name: "NOTE" data_type: TYPE_STRING dims: [ 1 ] }]\n'
                     + ONE + DECOUPLED, THREADED_DECOUPLED)
    for name in ("relative_a", "relative_b"):
        folder = add_python_model(repository, name, 'output [{ name: "WHO" data_type: TYPE_STRING dims: [ 2 ] }]\n' + ONE,
                                  RELATIVE)
        (folder / "1" / "helper.py").write_text(f'WHO = "{name}"\n\n\ndef who():\n    return WHO\n')
    add_python_model(repository, "argv", 'input [{ name: "EXIT" data_type: TYPE_BOOL dims: [ 1 ] }]\n'
                     'output [{ name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] }]\n' + ONE, ARGV)
    add_python_model(repository, "exit_in_initialize", X + Y + ONE, EXIT_IN_INITIALIZE)
    return repository


@pytest.fixture(scope="module", params=PYTHON_MODES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("python_triton_cases")
    loads = [arg for name in LOADED for arg in ("--load-model", name)]
    running = start_server(_repository(root), root / "logs", "--model-control-mode", "explicit", *loads,
                           *python_mode(request.param))
    yield running
    assert running.stop() == 0


class _Stream:
    """A gRPC stream's responses (result or error) in a queue; leaving it cancels what is in flight
    (a test that fails does not wait for a model that never answers)."""

    def __init__(self, client: grpcclient.InferenceServerClient) -> None:
        self.client = client
        self.items: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: self.items.put(error if error is not None else result))

    def get(self, timeout: float = 30):
        return self.items.get(timeout=timeout)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.stop_stream(cancel_requests=True)


@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_a_bls_model_name_given_as_bytes_names_the_model(server: Server, module) -> None:
    with client_for(module, server) as client:
        result = client.infer("bls_bytes_name", [infer_input(module, "MODEL_NAME", np.array([b"double"], np.object_), "BYTES"),
                                                 infer_input(module, "X", np.array([2.5], np.float32), "FP32")])
    np.testing.assert_array_equal(result.as_numpy("Y"), [5.0])


@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_each_triton_error_code_has_tritons_status(server: Server, module) -> None:
    with client_for(module, server) as client:
        for code, (grpc_status, http_status) in enumerate(STATUSES):
            with pytest.raises(InferenceServerException) as raised:
                client.infer("error_codes", [infer_input(module, "CODE", np.array([code], np.int32), "INT32")])
            assert raised.value.message() == f"code {code}"
            expected = f"StatusCode.{grpc_status}" if module is grpcclient else str(http_status)
            assert str(raised.value.status()) == expected, (code, raised.value.status())


@pytest.mark.parametrize(("module", "binary"), [(grpcclient, True), (httpclient, True), (httpclient, False)])
def test_an_output_keeps_the_datatype_the_model_made_and_an_empty_bytes_output_is_empty(
        server: Server, module, binary: bool) -> None:
    # FP16 travels only as binary data over HTTP (Triton: "sending FP16 data via JSON is not supported")
    outputs = None if module is grpcclient else [httpclient.InferRequestedOutput(n, binary_data=binary or n == "F")
                                                  for n in "IFS"]
    with client_for(module, server) as client:
        result = client.infer("other_types", [], outputs=outputs)
    described = {o["name"] if isinstance(o, dict) else o.name: o for o in
                 (result.get_response()["outputs"] if module is httpclient else result.get_response().outputs)}
    datatypes = {name: o["datatype"] if isinstance(o, dict) else o.datatype for name, o in described.items()}
    assert datatypes == {"I": "INT64", "F": "FP16", "S": "BYTES"}  # configured: INT32, FP32, STRING
    np.testing.assert_array_equal(result.as_numpy("I"), np.array([1, 2], np.int64))
    assert result.as_numpy("I").dtype == np.int64
    assert result.as_numpy("F").dtype == np.float16 and result.as_numpy("F")[0] == 0.5
    assert result.as_numpy("S").shape == (0,)


def test_async_decoupled_executes_overlap_and_their_tasks_outlive_them(server: Server) -> None:
    """4 requests that each sleep 1 s (asyncio) on one instance answer within 2 s; each then gets a
    final response from a task its execute started (qa/L0_backend_python/async_execute)."""
    with grpcclient.InferenceServerClient(server.url) as client:
        with _Stream(client) as stream:
            began = time.monotonic()
            for index in range(4):
                client.async_stream_infer("async_decoupled",
                                          [infer_input(grpcclient, "WAIT", np.array([1.0], np.float32), "FP32")],
                                          request_id=str(index))
            got = [stream.get() for _ in range(8)]
            took = time.monotonic() - began
    assert not [item for item in got if isinstance(item, Exception)], got
    values = sorted(float(item.as_numpy("OUT")[0]) for item in got)
    assert values == [-1.0] * 4 + [1.0] * 4
    assert took < 2.0, took
    assert "Task was destroyed" not in server.log()


@pytest.mark.parametrize(("mode", "value", "error"), [
    ("returned", 0, None),
    ("two", 1, None),  # the first response is the answer; the second send is refused
    ("sent_and_returned", 1, None),  # the sent response wins; the returned one is dropped
    ("thread", 3, None),  # sent by a thread after execute returned
    ("task", 4, None),  # sent by an asyncio task after execute returned
    ("final_only", None, "Failed to process the request(s) for model 'sender_0_0', message: TritonModelException: "
                         "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                         "response."),
])
@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_the_response_sender_of_a_model_answered_once(server: Server, module, mode: str, value: int | None,
                                                      error: str | None) -> None:
    with client_for(module, server) as client:
        inputs = [infer_input(module, "MODE", np.array([mode.encode()], np.object_), "BYTES")]
        if error is not None:
            with pytest.raises(InferenceServerException) as raised:
                client.infer("sender", inputs)
            assert raised.value.message() == error
            return
        result = client.infer("sender", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), [value])
    if mode == "two":
        assert ("second send refused: Unable to send response. Non-decoupled model cannot send more than one "
                "response.") in server.log()


def test_bls_from_a_thread_of_a_decoupled_model_and_not_in_initialize(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with _Stream(client) as stream:
            client.async_stream_infer("threaded", [infer_input(grpcclient, "X", np.array([4.0], np.float32), "FP32")])
            result = stream.get()
    assert not isinstance(result, Exception), result
    np.testing.assert_array_equal(result.as_numpy("Y"), [8.0])
    assert result.as_numpy("NOTE")[0] == b"BLS is only supported during the 'execute' function."


def test_a_cancelled_stream_is_seen_by_the_thread_answering_after_execute(server: Server) -> None:
    """qa/python_models/execute_cancel, decoupled: its thread sees ``is_cancelled()`` turn true."""
    with grpcclient.InferenceServerClient(server.url) as client:
        with _Stream(client) as stream:  # leaving it cancels the request
            client.async_stream_infer("threaded", [infer_input(grpcclient, "X", np.array([-1.0], np.float32), "FP32")])
            for _ in range(3):  # it is answering from its thread
                assert not isinstance(stream.get(), Exception)
    line = wait_until(lambda: next((line for line in server.log().splitlines() if "[threaded] request cancelled" in line),
                                   None), "the thread saw the request cancelled", timeout=30)
    assert int(line.rsplit("after ", 1)[1].split()[0]) < 100


def test_a_model_imports_its_own_folder_relatively(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        answers = {name: list(client.infer(name, []).as_numpy("WHO")) for name in ("relative_a", "relative_b")}
    assert answers == {"relative_a": [b"relative_a"] * 2, "relative_b": [b"relative_b"] * 2}


def test_model_code_sees_the_stub_argv_and_its_system_exit_fails_only_the_model(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        report = json.loads(client.infer("argv", [infer_input(grpcclient, "EXIT", np.array([False]), "BOOL")])
                            .as_numpy("REPORT")[0])
        with pytest.raises(InferenceServerException) as raised:
            client.infer("argv", [infer_input(grpcclient, "EXIT", np.array([True]), "BOOL")])
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("exit_in_initialize")
        assert client.is_server_live() and client.is_model_ready("argv")
    assert report == {"argv": [""], "ran": 1, "ok": True}  # Triton's stub: an interpreter given no arguments
    assert raised.value.message() == "Failed to process the request(s) for model 'argv_0_0', message: SystemExit: 3"
    assert ("python model 'exit_in_initialize' instance 'exit_in_initialize_0_0' failed to initialize: "
            "SystemExit: no GPU here") in refused.value.message()
