"""Python models run in stub processes of their own (``EXECUTION_MODE`` ``process``), through a real
server and unmodified tritonclient: the same answers as in process over gRPC and REST, a pid that is
not the server's, a crash (``os._exit``) that fails its request with Triton's text while the server and
another model serve on and the instance restarts, an execute that never returns killed after
``--backend-config=python,stub-timeout-seconds=N`` (the same text, a restart), a request larger than the shared memory region
(``--backend-config=python,shm-default-byte-size=...``), errors with the in-process texts, request and
response parameters, auto-complete in the stub, decoupled responses (also sent by threads after
execute returned), BLS (to a decoupled model too), custom metrics and model control answered by the
server, finalize at unload, a bad EXECUTION_MODE or --backend-config refused, and the benchmark's smoke run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import ROOT, Server, add_python_model, metric, scrape, start_server, wait_until

PROCESS = 'parameters: { key: "EXECUTION_MODE" value: { string_value: "process" } }\n'
ADD_SUB_CONFIG = '''
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }]
instance_group [{ count: 2 kind: KIND_CPU }]
dynamic_batching {}
'''
ADD_SUB = '''
    import json
    import os
    import sys

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.args = args

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                if a.size and a.flat[0] == -1:
                    raise ValueError("a negative number")
                if a.size and a.flat[0] == -2:
                    os._exit(1)  # the stub dies
                info = json.dumps({"argv": sys.argv, "dir": pb_utils.get_model_dir(), "id": request.request_id(),
                                   "parameters": json.loads(request.parameters()), "requests": len(requests),
                                   "instance": self.args["model_instance_name"]})
                rows = a.shape[0]
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b),
                    pb_utils.Tensor("PID", np.full((rows, 1), os.getpid(), np.int64)),
                    pb_utils.Tensor("INFO", np.array([[info.encode()]] * rows, dtype=np.object_))],
                    parameters={"instance": self.args["model_instance_name"], "rows": rows}))
            return responses

        def finalize(self):
            with open(os.path.join(pb_utils.get_model_dir(), "finalized"), "w") as done:
                done.write(self.args["model_instance_name"])
'''
AUTO_COMPLETED = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]})
            config.add_output({"name": "UPPER", "data_type": "TYPE_STRING", "dims": [-1]})
            return config

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", np.array(
                [t.upper() for t in pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()], dtype=np.object_))])
                for r in requests]
'''
DECOUPLED = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                for i in range(count):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
'''
THREADED = '''
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        """Triton's decoupled pattern: execute returns at once, a thread sends the responses."""

        def initialize(self, args):
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(__import__("json").loads(
                args["model_config"]))

        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.answer, args=(request,)).start()
            return None

        def answer(self, request):
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(count if self.decoupled else 1):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i + 100], np.int32))]))
            if self.decoupled:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                try:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([0], np.int32))]))
                except pb_utils.TritonModelException as err:  # Triton's text, raised in the stub
                    pb_utils.Logger.log_info(f"second send refused: {err}")
'''
BLS = '''
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "N").as_numpy().astype(np.float32).reshape(1, 1)
                called = pb_utils.InferenceRequest(model_name="add_sub_in_process", requested_output_names=["OUTPUT0", "PID"],
                                                   inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]).exec()
                failed = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=["X"]).exec()
                total = pb_utils.get_output_tensor_by_name(called, "OUTPUT0").as_numpy()
                pids = [int(pb_utils.get_output_tensor_by_name(called, "PID").as_numpy()[0, 0]), os.getpid()]
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("I", total.reshape(1).astype(np.int32))],
                                                            parameters={"pids": str(pids), "error": failed.error().message()}))
            return responses
'''
ASKS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            what = pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()[0]
            if what == 0:
                n = pb_utils.Tensor("N", np.array([3], np.int32))
                stream = pb_utils.InferenceRequest(model_name="decoupled", requested_output_names=["I"],
                                                   inputs=[n]).exec(decoupled=True)
                got = [int(pb_utils.get_output_tensor_by_name(r, "I").as_numpy()[0]) for r in stream
                       if pb_utils.get_output_tensor_by_name(r, "I") is not None]
                raise ValueError(f"streamed: {got}")
            raise ValueError(f"add_sub ready: {pb_utils.is_model_ready('add_sub')}, "
                             f"nothing ready: {pb_utils.is_model_ready('nothing')}")
'''
METRICS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            # the families are kept: a metric whose MetricFamily object is gone refuses its operations
            self.families = [pb_utils.MetricFamily(name="stub_requests", description="Requests seen in a stub",
                                                   kind=pb_utils.MetricFamily.COUNTER),
                             pb_utils.MetricFamily(name="stub_sizes", description="Sizes",
                                                   kind=pb_utils.MetricFamily.HISTOGRAM)]
            self.requests = self.families[0].Metric(labels={"model": args["model_name"]})
            self.sizes = self.families[1].Metric(buckets=[1.0, 10.0])

        def execute(self, requests):
            responses = []
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                self.requests.increment(n)
                self.sizes.observe(n)
                try:
                    self.requests.set(5)
                    refused = ""
                except pb_utils.TritonModelException as err:
                    refused = str(err)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array(
                    [self.requests.value()], np.int32))], parameters={"refused": refused}))
            return responses
'''
N_CONFIG = '''
input [{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "I" data_type: TYPE_INT32 dims: [ 1 ] }]
'''
HANGS = '''
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            n = pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()
            while n[0] == -3:  # never returns: the server's stub-timeout-seconds ends it
                time.sleep(1)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("I", n)]) for _ in requests]
'''
MODELS = ("add_sub", "add_sub_in_process", "auto_completed", "decoupled", "asks", "threaded", "threaded_once", "bls",
          "metrics")


def _repository(root: Path) -> Path:
    repository = root / "models"
    add_python_model(repository, "add_sub", ADD_SUB_CONFIG + PROCESS, ADD_SUB)
    add_python_model(repository, "add_sub_in_process", ADD_SUB_CONFIG, ADD_SUB)
    add_python_model(repository, "auto_completed", PROCESS, AUTO_COMPLETED)
    add_python_model(repository, "decoupled", N_CONFIG + PROCESS + "model_transaction_policy { decoupled: true }",
                     DECOUPLED)
    add_python_model(repository, "asks", N_CONFIG + PROCESS, ASKS)
    add_python_model(repository, "bls", N_CONFIG + PROCESS, BLS)
    add_python_model(repository, "metrics", N_CONFIG + PROCESS, METRICS)
    add_python_model(repository, "threaded", N_CONFIG + PROCESS + "model_transaction_policy { decoupled: true }",
                     THREADED)
    add_python_model(repository, "threaded_once", N_CONFIG + PROCESS, THREADED)
    add_python_model(repository, "bad_mode", N_CONFIG + PROCESS.replace('"process"', '"stub"'), DECOUPLED)
    return repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("python_process")
    loads = [arg for name in MODELS for arg in ("--load-model", name)]
    running = start_server(_repository(root), root / "logs", "--model-control-mode", "explicit", *loads,
                           "--backend-config", "python,shm-default-byte-size=1048576",
                           "--backend-config", "python,shm-growth-byte-size=262144",
                           "--backend-config", "python,shm-region-prefix-name=kserve_v2_test_process_")
    yield running
    assert running.stop() == 0
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"kserve_v2_test_process_add_sub_{running.proc.pid}_")]


def _inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    tensors = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors


def _client(server: Server, module):
    return module.InferenceServerClient(server.url if module is grpcclient else server.http_url)


@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_a_process_model_answers_as_the_in_process_one(server: Server, module) -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    with _client(server, module) as client:
        answers = {name: client.infer(name, _inputs(module, a, b), request_id="r1", parameters={"p": "v", "n": 3})
                   for name in ("add_sub", "add_sub_in_process")}
    for name, answer in answers.items():
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), a - b)
        info = json.loads(answer.as_numpy("INFO")[0, 0])
        assert info["argv"] == [""] and info["id"] == "r1" and info["parameters"] == {"p": "v", "n": 3}
        assert info["dir"].endswith(f"{name}/1")
        response = answer.get_response(as_json=True) if module is grpcclient else answer.get_response()
        parameters = response["parameters"]
        rows = parameters["rows"]["int64_param"] if module is grpcclient else parameters["rows"]
        assert int(rows) == 2
    pids = {name: int(answer.as_numpy("PID")[0, 0]) for name, answer in answers.items()}
    assert pids["add_sub_in_process"] == server.proc.pid
    assert pids["add_sub"] != server.proc.pid


def test_an_error_in_execute_has_the_in_process_text(server: Server) -> None:
    a = np.full((1, 2), -1, np.float32)
    messages = []
    with grpcclient.InferenceServerClient(server.url) as client:
        for name in ("add_sub", "add_sub_in_process"):
            with pytest.raises(InferenceServerException) as raised:
                client.infer(name, _inputs(grpcclient, a, a))
            messages.append(raised.value.message())
            assert str(raised.value.status()) == "StatusCode.INTERNAL"
    for name, message in zip(("add_sub", "add_sub_in_process"), messages, strict=True):
        assert re.fullmatch(f"Failed to process the request\\(s\\) for model '{name}_0_[01]', message: ValueError: "
                            "a negative number", message), message


def test_a_crashing_stub_fails_its_request_and_restarts_while_the_server_serves_on(server: Server) -> None:
    good = np.ones((1, 2), np.float32)
    crash = np.full((1, 2), -2, np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("add_sub", _inputs(grpcclient, crash, crash))
        other = client.infer("add_sub_in_process", _inputs(grpcclient, good, good))
        after = [client.infer("add_sub", _inputs(grpcclient, good, good)) for _ in range(4)]  # both instances
        assert client.is_server_live() and client.is_model_ready("add_sub")
    message = raised.value.message()
    instance = message.split("'")[1]
    assert message == (f"Failed to process the request(s) for model instance '{instance}', message: Stub process "
                       f"'{instance}' is not healthy.")
    assert str(raised.value.status()) == "StatusCode.INTERNAL"
    np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), good * 2)
    for answer in after:
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), good * 2)
    assert f"the stub process of python model instance '{instance}' exited (exit code 1)" in server.log()


def test_an_execute_past_the_stub_timeout_kills_the_stub_which_restarts_while_others_serve(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    add_python_model(repository, "hangs", N_CONFIG + PROCESS, HANGS)
    add_python_model(repository, "answers", N_CONFIG, HANGS)
    running = start_server(repository, tmp_path / "logs", "--backend-config", "python,stub-timeout-seconds=2")
    try:
        with grpcclient.InferenceServerClient(running.url) as client:
            hung: list = []
            done = threading.Event()
            started = time.monotonic()
            client.async_infer("hangs", [_n(-3)], callback=lambda result, error: (hung.append(error), done.set()))
            other = client.infer("answers", [_n(5)])
            answered_meanwhile = not done.is_set()
            assert done.wait(30), "the request past the stub timeout got no answer"
            elapsed = time.monotonic() - started
            after = client.infer("hangs", [_n(7)])
        message = hung[0].message()
        instance = message.split("'")[1]
        assert message == (f"Failed to process the request(s) for model instance '{instance}', message: Stub process "
                           f"'{instance}' is not healthy.")
        assert instance.startswith("hangs_")
        assert 2 <= elapsed <= 10, elapsed
        assert answered_meanwhile and other.as_numpy("I").tolist() == [5]
        assert after.as_numpy("I").tolist() == [7]
        assert (f"the stub process of python model instance '{instance}' did not answer Execute within "
                "stub-timeout-seconds (2 s)") in running.log()
    finally:
        assert running.stop() == 0


def _n(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


@pytest.mark.parametrize("module", [grpcclient, httpclient])
def test_a_request_larger_than_the_region_grows_it(server: Server, module) -> None:
    a = np.random.default_rng(0).random((1, 700_000), dtype=np.float32)  # 2 x 2.8 MB in, 2 x 2.8 MB out: 1 MiB regions
    with _client(server, module) as client:
        answer = client.infer("add_sub", _inputs(module, a, a))
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), np.zeros_like(a))


def test_auto_complete_runs_in_the_stub(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("auto_completed", as_json=True)["config"]
        text = grpcclient.InferInput("TEXT", [2], "BYTES")
        text.set_data_from_numpy(np.array([b"ab", b"cd"], dtype=np.object_))
        answer = client.infer("auto_completed", [text])
    assert [t["name"] for t in config["input"]] == ["TEXT"] and [t["name"] for t in config["output"]] == ["UPPER"]
    assert answer.as_numpy("UPPER").tolist() == [b"AB", b"CD"]


def test_a_decoupled_model_streams_from_the_stub(server: Server) -> None:
    received: list = []
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: received.append(error or result))
        count = grpcclient.InferInput("N", [1], "INT32")
        count.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("decoupled", [count], enable_empty_final_response=True)
        client.stop_stream()
    values = [r.as_numpy("I") for r in received if r.as_numpy("I") is not None]
    assert [int(v[0]) for v in values] == [0, 1, 2]


def test_responses_sent_by_threads_after_execute_returned_reach_the_client(server: Server) -> None:
    received: list = []
    count = grpcclient.InferInput("N", [1], "INT32")
    count.set_data_from_numpy(np.array([3], np.int32))
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: received.append(error or result))
        for _ in range(2):
            client.async_stream_infer("threaded", [count])
        client.stop_stream()
        once = client.infer("threaded_once", [count])
    assert sorted(int(r.as_numpy("I")[0]) for r in received) == [100, 100, 101, 101, 102, 102]
    assert once.as_numpy("I").tolist() == [100]
    refused = "second send refused: Unable to send response. Non-decoupled model cannot send more than one response."
    wait_until(lambda: refused in server.log(), "the stub's log line of the refused second send", timeout=20)


def test_a_bls_request_from_the_stub_runs_in_the_server(server: Server) -> None:
    count = grpcclient.InferInput("N", [1], "INT32")
    count.set_data_from_numpy(np.array([21], np.int32))
    with grpcclient.InferenceServerClient(server.url) as client:
        answer = client.infer("bls", [count])
    assert answer.as_numpy("I").tolist() == [42]
    parameters = answer.get_response(as_json=True)["parameters"]
    callee, stub = json.loads(parameters["pids"]["string_param"])
    assert callee == server.proc.pid and stub != server.proc.pid
    assert "no_such_model" in parameters["error"]["string_param"]


def test_custom_metrics_of_a_stub_are_the_servers(server: Server) -> None:
    count = grpcclient.InferInput("N", [1], "INT32")
    count.set_data_from_numpy(np.array([3], np.int32))
    with grpcclient.InferenceServerClient(server.url) as client:
        answers = [client.infer("metrics", [count]) for _ in range(2)]
    assert [a.as_numpy("I").tolist() for a in answers] == [[3], [6]]
    refused = answers[0].get_response(as_json=True)["parameters"]["refused"]["string_param"]
    assert refused == "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    samples = scrape(server.metrics_port)
    assert metric(samples, "stub_requests", model="metrics") == 6
    assert metric(samples, "stub_sizes_count") == 2 and metric(samples, "stub_sizes_bucket", le="10") == 2


@pytest.mark.parametrize(("n", "text"), [
    (0, "ValueError: streamed: [0, 1, 2]"),
    (1, "ValueError: add_sub ready: True, nothing ready: False")])
def test_a_bls_stream_and_the_model_control_api_are_the_servers(server: Server, n: int, text: str) -> None:
    count = grpcclient.InferInput("N", [1], "INT32")
    count.set_data_from_numpy(np.array([n], np.int32))
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("asks", [count])
    assert raised.value.message().endswith(f"message: {text}")


def test_a_bad_execution_mode_fails_the_load_naming_the_key_and_values(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("bad_mode")
    assert "parameter EXECUTION_MODE must be one of 'in_process', 'process', not 'stub'" in raised.value.message()


def test_unload_runs_finalize_in_the_stub(server: Server, tmp_path: Path) -> None:
    folder = Path(json.loads(_info(server))["dir"])
    with grpcclient.InferenceServerClient(server.url) as client:
        client.unload_model("add_sub")
        ready = client.is_model_ready("add_sub")
        client.load_model("add_sub")
    assert not ready
    assert (folder / "finalized").read_text().startswith("add_sub_0_")


def _info(server: Server) -> str:
    one = np.ones((1, 1), np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        return client.infer("add_sub", _inputs(grpcclient, one, one)).as_numpy("INFO")[0, 0].decode()


def test_an_unknown_backend_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    for flag, text in (("tensorrt,x=1", "backend 'tensorrt' has no settings here"),
                       ("python,thread-pool-size=4", "python setting 'thread-pool-size' is not supported"),
                       ("python,shm-default-byte-size=1000", "shm-default-byte-size can't be smaller than 4 MiBs")):
        with pytest.raises(RuntimeError) as raised:
            start_server(tmp_path / "models", tmp_path / "logs", "--backend-config", flag)
        assert text in str(raised.value)


def test_the_benchmark_prints_its_table() -> None:
    """benchmarks/python_process.py --smoke: a row per mode with infer/s at c=1 and c=4, and the stubs' peak RSS,
    each under 60 MiB while idle."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "python_process.py"), "--smoke"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in done.stdout.splitlines()
                                              if line.startswith(("| in_process", "| process")))}
    assert list(rows) == ["in_process", "process"], done.stdout
    assert all(float(value) > 0 for values in rows.values() for value in values)
    idle = done.stdout.split("idle after load: ")[1].split(" MiB")[0].split(", ")
    assert len(idle) == 2 and all(0 < float(peak) <= 60 for peak in idle), done.stdout
