"""Triton python-backend APIs beyond execute, through a real server and unmodified tritonclient:
``InferenceResponse(parameters=)`` reaching the client (gRPC, REST, a decoupled stream; Triton's
checks of their types), a BLS request's ``timeout`` (Triton's "Request timeout expired") and
``cancel()`` on a decoupled BLS response iterator (the callee sees ``is_cancelled()``)."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import PYTHON_MODES, Server, add_python_model, metric, scrape, python_mode, start_server, wait_until

IO = '''
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
'''
TEXT_OUT = '''
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [1] }]
'''
PARAMETERS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if int(value[0]) < 0:  # a float value: Triton's binding refuses it
                    pb_utils.InferenceResponse(output_tensors=[], parameters={"ratio": 0.5})
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", value)],
                    parameters={"flag": True, "count": int(value[0]), "note": "from model"}))
            return responses
'''
STREAMED_PARAMETERS = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                for index in range(2):
                    sender.send(pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("OUT", np.array([index], np.int32))],
                        parameters={"index": index}))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
SLOW = '''
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(2)
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''
BLS_TIMEOUT = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                call = pb_utils.InferenceRequest(model_name="slow", requested_output_names=["OUT"],
                                                 inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                                                 timeout=200_000)  # microseconds
                answer = call.exec()
                text = f"{answer.error().code()}|{answer.error().message()}" if answer.has_error() else "answered"
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
            return responses
'''
TICKER = '''
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                for index in range(200):
                    if request.is_cancelled():
                        open(os.path.join(pb_utils.get_model_dir(), "saw_cancel"), "w").close()
                        break
                    sender.send(pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("OUT", np.array([index], np.int32))]))
                    time.sleep(0.05)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
BLS_CANCEL = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                call = pb_utils.InferenceRequest(model_name="ticker", requested_output_names=["OUT"],
                                                 inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
                received, errors = [], []
                iterator = call.exec(decoupled=True)
                for answer in iterator:
                    if answer.has_error():
                        errors.append(f"{answer.error().code()}|{answer.error().message()}")
                        continue
                    out = pb_utils.get_output_tensor_by_name(answer, "OUT")
                    if out is not None:
                        received.append(int(out.as_numpy()[0]))
                    if len(received) == 3:
                        iterator.cancel()
                text = f"{received}|{errors}"
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
            return responses
'''
METRICS = '''
    import os

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            labels = {"model": args["model_name"], "version": args["model_version"]}
            # the families are kept: a metric whose MetricFamily object is gone refuses its operations
            self.families = [
                pb_utils.MetricFamily(name="custom_requests", description="Requests seen",
                                      kind=pb_utils.MetricFamily.COUNTER),
                pb_utils.MetricFamily(name="custom_last_input", description="The last input",
                                      kind=pb_utils.MetricFamily.GAUGE),
                pb_utils.MetricFamily(name="custom_input_size", description="Inputs seen",
                                      kind=pb_utils.MetricFamily.HISTOGRAM),
                pb_utils.MetricFamily(name="custom_by_process", description="Requests per replica",
                                      kind=pb_utils.MetricFamily.COUNTER)]
            self.requests = self.families[0].Metric(labels=labels)
            self.last = self.families[1].Metric(labels=labels)
            self.sizes = self.families[2].Metric(labels=labels, buckets=[1.0, 10.0])
            self.by_process = self.families[3].Metric(labels={"pid": str(os.getpid())})
            try:
                self.requests.set(1)
            except pb_utils.TritonModelException as err:
                self.refused = str(err)

        def execute(self, requests):
            responses = []
            for request in requests:
                value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                self.requests.increment(1)
                self.by_process.increment(1)
                self.last.set(value)
                self.sizes.observe(value)
                assert self.requests.value() >= 1
                assert self.refused == ("Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not "
                                        "support Set"), self.refused
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())]))
            return responses
'''
LOADER = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                action = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                try:
                    if action == 1:
                        pb_utils.load_model(model_name="params")
                    elif action == 2:
                        pb_utils.unload_model(model_name="params")
                    elif action == 3:
                        pb_utils.is_model_ready(model_name="params", model_version="zero")
                    text = f"ready={pb_utils.is_model_ready(model_name='params')}"
                except pb_utils.TritonModelException as err:
                    text = str(err)
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
            return responses
'''
INIT_LOADER = '''
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):  # the README's pattern: load what the model calls
            if not pb_utils.is_model_ready(model_name="params", model_version="1"):
                config = json.dumps({"backend": "python", "max_batch_size": 0,
                                     "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
                                     "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]})
                pb_utils.load_model(model_name="params", config=config)

        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''
DECOUPLED = "model_transaction_policy { decoupled: true }"


def _repository(root: Path) -> Path:  # every model loads in control modes none and poll
    repository = root / "models"
    add_python_model(repository, "params", IO, PARAMETERS)
    add_python_model(repository, "streamed_params", IO + DECOUPLED, STREAMED_PARAMETERS)
    add_python_model(repository, "slow", IO, SLOW)
    add_python_model(repository, "bls_timeout", TEXT_OUT, BLS_TIMEOUT)
    add_python_model(repository, "ticker", IO + DECOUPLED, TICKER)
    add_python_model(repository, "bls_cancel", TEXT_OUT, BLS_CANCEL)
    add_python_model(repository, "metered", IO, METRICS)
    add_python_model(repository, "loader", TEXT_OUT, LOADER)
    return repository


@pytest.fixture(scope="module", params=PYTHON_MODES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("python_apis")
    running = start_server(_repository(root), root / "logs", *python_mode(request.param))
    running.repository = root / "models"  # type: ignore[attr-defined]
    yield running
    assert running.stop() == 0


def _input(module, value: int):
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def test_response_parameters_reach_grpc_and_rest_clients(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        parameters = client.infer("params", [_input(grpcclient, 7)]).get_response().parameters
        assert parameters["flag"].bool_param is True
        assert parameters["count"].int64_param == 7
        assert parameters["note"].string_param == "from model"
    with httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
        response = client.infer("params", [_input(httpclient, 9)]).get_response()
        assert response["parameters"] == {"flag": True, "count": 9, "note": "from model"}
        with pytest.raises(InferenceServerException, match="Expect parameters values to have type bool/int/str"):
            client.infer("params", [_input(httpclient, -1)])
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/params/generate",
                                     data=json.dumps({"IN": 4}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer = json.loads(reply.read())
    assert (answer["OUT"], answer["flag"], answer["count"], answer["note"]) == (4, True, 4, "from model"), answer


def test_response_parameters_of_a_decoupled_model_reach_the_stream(server: Server) -> None:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("streamed_params", [_input(grpcclient, 0)])
        seen = []
        for _ in range(2):
            result, error = results.get(timeout=30)
            assert error is None
            seen.append((int(result.as_numpy("OUT")[0]), result.get_response().parameters["index"].int64_param))
        assert seen == [(0, 0), (1, 1)]
    finally:
        client.stop_stream()
        client.close()


def test_bls_timeout_expires_with_tritons_text(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        started = time.monotonic()
        text = client.infer("bls_timeout", [_input(grpcclient, 1)]).as_numpy("OUT")[0].decode()
        elapsed = time.monotonic() - started
    assert text.endswith("|Request timeout expired"), text
    assert elapsed < 1.5, elapsed  # the slow model takes 2 s; the caller waited 0.2 s


def test_cancelling_a_decoupled_bls_stream_cancels_the_callee(server: Server) -> None:
    marker = server.repository / "ticker" / "1" / "saw_cancel"  # type: ignore[attr-defined]
    with grpcclient.InferenceServerClient(server.url) as client:
        text = client.infer("bls_cancel", [_input(grpcclient, 1)]).as_numpy("OUT")[0].decode()
    received, errors = text.split("|", 1)
    assert received == "[0, 1, 2]", text  # nothing after cancel() reaches the caller
    assert "CANCELLED" in errors or "cancelled" in errors, text
    wait_until(marker.exists, "the callee's is_cancelled() turned true", timeout=30)


def _metered(server: Server, values: list[int]) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        for value in values:
            client.infer("metered", [_input(grpcclient, value)])


def test_custom_metrics_are_scraped(server: Server) -> None:
    _metered(server, [0, 5, 50])
    samples = scrape(server.metrics_port)
    labels = {"model": "metered", "version": "1"}
    assert metric(samples, "custom_requests", **labels) == 3
    assert metric(samples, "custom_last_input", **labels) == 50
    assert [metric(samples, "custom_input_size_bucket", le=le, **labels) for le in ("1", "10", "+Inf")] == [1, 2, 3]
    assert metric(samples, "custom_input_size_count", **labels) == 3
    assert metric(samples, "custom_input_size_sum", **labels) == 55


def test_custom_metrics_go_with_their_model_and_sum_over_workers(tmp_path: Path) -> None:
    running = start_server(_repository(tmp_path), tmp_path / "logs", "--workers", "2", "--model-control-mode",
                           "explicit", "--load-model", "metered")
    try:
        sent = 0

        def replicas() -> int:  # each connection reaches one replica: connect until both have answered
            nonlocal sent
            _metered(running, [2])
            sent += 1
            return len([1 for name, _ in scrape(running.metrics_port) if name == "custom_by_process"]) == 2

        wait_until(replicas, "both replicas answered")
        samples = scrape(running.metrics_port)
        assert metric(samples, "custom_requests", model="metered", version="1") == sent  # summed over replicas
        assert metric(samples, "custom_input_size_count", model="metered", version="1") == sent
        assert sum(value for (name, _), value in samples.items() if name == "custom_by_process") == sent
        with httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}") as client:
            client.unload_model("metered")
        wait_until(lambda: not any(name == "custom_requests" for name, _ in scrape(running.metrics_port)),
                   "the model's families left /metrics with it")
    finally:
        assert running.stop() == 0


def _loader(server: Server, action: int) -> str:
    with grpcclient.InferenceServerClient(server.url) as client:
        return client.infer("loader", [_input(grpcclient, action)]).as_numpy("OUT")[0].decode()


def test_a_model_loads_and_unloads_another_in_explicit_mode(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    add_python_model(repository, "init_loader", IO, INIT_LOADER)  # loaded by the client: after startup, as Triton wants
    running = start_server(repository, tmp_path / "logs", "--model-control-mode", "explicit", "--load-model", "loader")
    try:
        with grpcclient.InferenceServerClient(running.url) as client:
            assert not client.is_model_ready("params")
            assert _loader(running, 0) == "ready=False"
            assert _loader(running, 1) == "ready=True"
            assert client.is_model_ready("params")
            assert client.infer("params", [_input(grpcclient, 3)]).as_numpy("OUT").tolist() == [3]
            assert _loader(running, 3) == ("Failed to check model readiness: failed to get model version from specified "
                                           "version string 'zero' (details: invalid literal for int() with base 10: "
                                           "'zero'), version should be an integral value > 0")
            assert _loader(running, 2) == "ready=False"
            assert not client.is_model_ready("params")
            client.load_model("init_loader")  # its initialize loads "params" with a configuration of its own
            assert client.is_model_ready("params")
            assert client.infer("params", [_input(grpcclient, 5)]).get_response().parameters["count"].int64_param == 5
    finally:
        assert running.stop() == 0


def test_the_model_loading_api_is_refused_in_poll_mode(tmp_path: Path) -> None:
    running = start_server(_repository(tmp_path), tmp_path / "logs", "--model-control-mode", "poll")
    try:
        refused = "explicit model load / unload is not allowed if polling is enabled"
        assert _loader(running, 1) == f"Failed to load model: {refused}"
        assert _loader(running, 2) == f"Failed to unload model: {refused}"
        assert _loader(running, 0) == "ready=True"  # readiness is read in any mode
    finally:
        assert running.stop() == 0
