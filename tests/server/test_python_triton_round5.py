"""Python-backend details that Triton 2.51's own qa tests check, through a real server and unmodified
tritonclient, in both execution modes (in process, and ``EXECUTION_MODE: "process"``): BYTES outputs
built from Python objects (``qa/L0_parameters``' ``parameter`` model and ``qa/python_models/string_fixed``),
the type checks of ``pb_utils``' bindings (``qa/L0_backend_python/argument_validation``), custom metrics
as ``qa/python_models/custom_metrics`` checks them (one family per name, series with other label names,
histogram bucket checks, ``le`` as Triton writes it, a metric refused once its ``MetricFamily`` is
deleted), and an ``async def execute`` that iterates a decoupled BLS call's responses at once, over
several requests, and one that raises in the background (``qa/L0_backend_python/async_execute``)."""

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

from helpers import Server, add_python_model, client_for, infer_input, metrics_text, start_server, wait_until

PROCESS = 'parameters: { key: "EXECUTION_MODE" value: { string_value: "process" } }\n'
MODES = ("in_process", "process")
# the qa `parameter` model: the request's parameters as two BYTES outputs made from Python objects
PARAMETER = '''
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                parameters = json.loads(request.parameters())
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("key", np.asarray(list(parameters), dtype=object)),
                    pb_utils.Tensor("value", np.asarray(list(parameters.values()), dtype=object))]))
            return responses
'''
# qa/python_models/string_fixed: a fixed string and an empty output in turn, as np.bytes_ and np.object_
STRING_FIXED = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.index = 0

        def execute(self, requests):
            responses = []
            for _ in requests:
                if self.index % 2 == 0:
                    out = pb_utils.Tensor("OUTPUT0", np.array(["123456"], dtype=np.bytes_))
                else:
                    out = pb_utils.Tensor("OUTPUT0", np.array([], dtype=np.object_))
                self.index += 1
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
'''
# qa/L0_backend_python/argument_validation: what each wrong call raises, by case, as JSON
ARGUMENTS = '''
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils

    TENSOR = pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))
    REQUEST = {"inputs": [TENSOR], "model_name": "my_model", "requested_output_names": ["my_output"]}
    CASES = {
        "request_inputs_none_item": lambda: pb_utils.InferenceRequest(**{**REQUEST, "inputs": [None]}),
        "request_inputs_none": lambda: pb_utils.InferenceRequest(**{**REQUEST, "inputs": None}),
        "request_model_name_none": lambda: pb_utils.InferenceRequest(**{**REQUEST, "model_name": None}),
        "request_output_name_none": lambda: pb_utils.InferenceRequest(**{**REQUEST, "requested_output_names": [None]}),
        "request_output_names_none": lambda: pb_utils.InferenceRequest(**{**REQUEST, "requested_output_names": None}),
        "request_correlation_id_none": lambda: pb_utils.InferenceRequest(**REQUEST, correlation_id=None),
        "request_correlation_id_float": lambda: pb_utils.InferenceRequest(**REQUEST, correlation_id=1.5),
        "request_request_id_none": lambda: pb_utils.InferenceRequest(**REQUEST, request_id=None),
        "request_model_version_none": lambda: pb_utils.InferenceRequest(**REQUEST, model_version=None),
        "request_flags_none": lambda: pb_utils.InferenceRequest(**REQUEST, flags=None),
        "request_empty_lists": lambda: pb_utils.InferenceRequest(requested_output_names=[], inputs=[],
                                                                 model_name="my_model"),
        "request_correlation_ids": lambda: [pb_utils.InferenceRequest(**REQUEST, correlation_id=5).correlation_id(),
                                            pb_utils.InferenceRequest(**REQUEST, correlation_id="id-5").correlation_id(),
                                            pb_utils.InferenceRequest(**REQUEST).correlation_id()],
        "response_outputs_none_item": lambda: pb_utils.InferenceResponse(output_tensors=[None]),
        "response_outputs_none": lambda: pb_utils.InferenceResponse(output_tensors=None),
        "response_outputs_empty": lambda: pb_utils.InferenceResponse(output_tensors=[]),
        "response_outputs": lambda: len(pb_utils.InferenceResponse([TENSOR]).output_tensors()),
        "tensor_name_none": lambda: pb_utils.Tensor(None, np.asarray([1, 2], dtype=np.int32)),
        "tensor_data_none": lambda: pb_utils.Tensor("OUTPUT0", None),
        "tensor_dlpack_none": lambda: pb_utils.Tensor.from_dlpack("OUTPUT0", None),
        "tensor_dlpack_empty_name": lambda: pb_utils.Tensor.from_dlpack("", None),
        "tensor_empty_name_data_none": lambda: pb_utils.Tensor("", None),
        "log_level_none": lambda: pb_utils.Logger.log("Invalid Level", None),
        "log_level_int": lambda: pb_utils.Logger.log("Invalid Level", 1),
        "log_info_none": lambda: pb_utils.Logger.log_info(None),
        "log_warn_none": lambda: pb_utils.Logger.log_warn(None),
        "log_error_none": lambda: pb_utils.Logger.log_error(None),
        "log_verbose_none": lambda: pb_utils.Logger.log_verbose(None),
        "log_unspecified_level": lambda: pb_utils.Logger.log("Level unspecified"),
    }


    def outcome(case):
        try:
            result = case()
        except Exception as err:
            return [type(err).__name__, str(err)]
        return ["ok", result if isinstance(result, list | int) else None]


    class TritonPythonModel:
        def execute(self, requests):
            report = json.dumps({name: outcome(case) for name, case in CASES.items()})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([report.encode()], np.object_))])
                    for _ in requests]
'''
# qa/python_models/custom_metrics' checks; the families are named after the model (one per mode) and kept
METRICS = '''
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils

    COUNTER, GAUGE, HISTOGRAM = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM


    class TritonPythonModel:
        def initialize(self, args):
            self.prefix = args["model_name"]
            self.kept = []

        def attempt(self, call):
            try:
                self.kept.append(call())
            except Exception as err:
                return [type(err).__name__, str(err)]
            return ["ok", None]

        def execute(self, requests):
            p, report = self.prefix, {}
            first = pb_utils.MetricFamily(name=f"{p}_dup", description="dup description", kind=COUNTER)
            second = pb_utils.MetricFamily(name=f"{p}_dup", description="second description", kind=COUNTER)
            one, two = first.Metric(labels={"key": "label1"}), second.Metric(labels={"key": "label2"})
            again = second.Metric(labels={"key": "label1"})
            again.increment(7.5)
            report["same_series"] = [one.value(), two.value()]
            report["no_labels"] = self.attempt(lambda: first.Metric())
            report["other_labels"] = self.attempt(lambda: first.Metric(labels={"a": "1", "b": "2"}))
            report["other_kind"] = self.attempt(lambda: pb_utils.MetricFamily(name=f"{p}_dup", description="",
                                                                              kind=GAUGE))
            report["bad_name"] = self.attempt(lambda: pb_utils.MetricFamily(name="9 lives", description="",
                                                                            kind=GAUGE))
            histogram = pb_utils.MetricFamily(name=f"{p}_histogram", description="histogram", kind=HISTOGRAM)
            report["no_buckets"] = self.attempt(lambda: histogram.Metric(labels={}))
            report["buckets_none"] = self.attempt(lambda: histogram.Metric(labels={}, buckets=None))
            report["unsorted"] = self.attempt(lambda: histogram.Metric(labels={}, buckets=[2.5, 0.1, 1.0, 10.0, 5.0]))
            report["duplicates"] = self.attempt(lambda: histogram.Metric(labels={}, buckets=[1, 1, 2, 5, 5]))
            report["empty"] = self.attempt(lambda: histogram.Metric(labels={}, buckets=[]))
            series = histogram.Metric(labels={"example1": "h1", "example2": "h2"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
            for value in (0.05, 1.5, 6.0):
                series.observe(value)
            self.kept += [first, second, one, two, again, histogram, series]
            return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([json.dumps(report).encode()],
                                                                                   np.object_))]) for _ in requests]
'''
# qa/python_models/custom_metrics test_metric_lifetime_error: a metric used after its MetricFamily is deleted
LIFETIME = '''
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    def outcome(call, *args):
        try:
            call(*args)
        except pb_utils.TritonModelException as err:
            return str(err)
        return "ok"


    class TritonPythonModel:
        def initialize(self, args):
            self.prefix = args["model_name"]

        def execute(self, requests):
            report = {}
            for kind, name in ((pb_utils.MetricFamily.COUNTER, "counter"), (pb_utils.MetricFamily.GAUGE, "gauge")):
                family = pb_utils.MetricFamily(name=f"{self.prefix}_{name}", description="lifetime", kind=kind)
                metric = family.Metric(labels={"example1": "label1"})
                metric.increment(1)
                del family
                report[name] = [outcome(metric.increment, 10), outcome(metric.value), outcome(metric.set, 10)]
            return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([json.dumps(report).encode()],
                                                                                   np.object_))]) for _ in requests]
'''
# qa/python_models/async_execute_decouple: answers after sleeping WAIT_SECONDS (asyncio); a negative wait
# ends its requests (the final flag alone) and raises
ASYNC_DECOUPLED = '''
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            waits = [float(pb_utils.get_input_tensor_by_name(r, "WAIT_SECONDS").as_numpy()[0][0]) for r in requests]
            if min(waits) < 0:
                for request in requests:
                    request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                raise ValueError("wait_secs cannot be negative")
            await asyncio.gather(*(asyncio.sleep(wait) for wait in waits))
            for request in requests:
                request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("DUMMY_OUT", np.zeros(1, np.float32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
'''
# qa/python_models/async_execute_decouple_bls: awaits async_exec(decoupled=True), then iterates it at once
ASYNC_BLS = '''
    import asyncio

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def answer(self, request):
            call = pb_utils.InferenceRequest(model_name="async_decoupled", requested_output_names=["DUMMY_OUT"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS")])
            responses = await call.async_exec(decoupled=True)
            sender = request.get_response_sender()
            for response in responses:
                out = pb_utils.get_output_tensor_by_name(response, "DUMMY_OUT").as_numpy()
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("DUMMY_OUT", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        async def execute(self, requests):
            await asyncio.gather(*(self.answer(request) for request in requests))
            return None
'''
WAIT_CONFIG = '''
max_batch_size: 8
input [{ name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU count: 1 }]
model_transaction_policy { decoupled: true }
'''
REPORT_CONFIG = 'output [{ name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] }]\ninstance_group [{ kind: KIND_CPU count: 1 }]\n'
MODELS = {
    "parameter": ('input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
                  'output [{ name: "key" data_type: TYPE_STRING dims: [ -1 ] }, '
                  '{ name: "value" data_type: TYPE_STRING dims: [ -1 ] }]\n', PARAMETER),
    "string_fixed": ('input [{ name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] }]\n'
                     'output [{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }]\n'
                     'instance_group [{ kind: KIND_CPU }]\n', STRING_FIXED),  # the qa's: one instance, as Triton
    "arguments": (REPORT_CONFIG, ARGUMENTS),
    "metrics": (REPORT_CONFIG, METRICS),
    "lifetime": (REPORT_CONFIG, LIFETIME),
    "async_bls": (WAIT_CONFIG, ASYNC_BLS),
}
# Triton's TypeError cases of argument_validation (pybind11 refuses the argument) and its TritonModelException ones
TYPE_ERRORS = ("request_inputs_none", "request_model_name_none", "request_output_name_none", "request_output_names_none",
               "request_correlation_id_none", "request_request_id_none", "request_model_version_none",
               "request_flags_none", "response_outputs_none", "tensor_name_none", "tensor_data_none",
               "tensor_empty_name_data_none", "log_level_none", "log_level_int", "log_info_none", "log_warn_none",
               "log_error_none", "log_verbose_none")
MODEL_EXCEPTIONS = {
    "request_inputs_none_item": "Input tensor for request with id '' and model name 'my_model' should not be empty.",
    "request_correlation_id_float": "Correlation ID must be integer or string",
    "response_outputs_none_item": "Output tensor for inference response should not be empty.",
}


def _repository(root: Path) -> Path:
    repository = root / "models"
    add_python_model(repository, "async_decoupled", WAIT_CONFIG, ASYNC_DECOUPLED)
    add_python_model(repository, "async_decoupled_process", WAIT_CONFIG + PROCESS, ASYNC_DECOUPLED)
    for name, (config, source) in MODELS.items():
        add_python_model(repository, f"{name}_in_process", config, source)
        add_python_model(repository, f"{name}_process", config + PROCESS, source)
    return repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("python_triton_round5")
    running = start_server(_repository(root), root / "logs")
    yield running
    assert running.stop() == 0


def _report(server: Server, model: str) -> dict:
    with grpcclient.InferenceServerClient(server.url) as client:
        return json.loads(client.infer(model, []).as_numpy("REPORT")[0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module", [grpcclient, httpclient])
@pytest.mark.parametrize("parameters", [{"key1": "value1", "key2": "value2"}, {"key1": 1, "key2": 2},
                                        {"key1": 123.123, "key2": 321.321}, {"key1": True, "key2": "value2"}])
def test_bytes_outputs_made_from_python_objects_are_their_str(server: Server, module, mode: str,
                                                              parameters: dict) -> None:
    """qa/L0_parameters: the model answers each parameter's value in an object array; a value that is
    not bytes or str is sent as str(value) (Triton's serialize_byte_tensor), so 1 reads "1", True "True"."""
    with client_for(module, server) as client:
        result = client.infer(f"parameter_{mode}", [infer_input(module, "INPUT0", np.ones(1, np.float32), "FP32")],
                              parameters=parameters)
    keys, values = result.as_numpy("key").astype(str).tolist(), result.as_numpy("value").astype(str).tolist()
    answered = dict(zip(keys, values, strict=True))
    assert answered == {key: str(value) for key, value in parameters.items()}


@pytest.mark.parametrize("mode", MODES)
def test_a_fixed_string_and_an_empty_output_in_turn(server: Server, mode: str) -> None:
    """qa/L0_backend_python/python_test.py::test_string (string_fixed: np.bytes_ and np.object_ arrays). Its
    group has no count: a python model gets one instance, as Triton completes it, so the turns alternate."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.get_model_config(f"string_fixed_{mode}")["instance_group"][0]["count"] == 1
        for index in range(4):
            result = client.infer(f"string_fixed_{mode}", [infer_input(httpclient, "INPUT0",
                                                                   np.array(["123456"], dtype=np.object_), "BYTES")])
            output = result.as_numpy("OUTPUT0")
            if index % 2 == 0:
                assert output.tolist() == [b"123456"]
            else:
                assert output.size == 0


@pytest.mark.parametrize("mode", MODES)
def test_pb_utils_refuse_wrong_arguments_as_tritons_bindings(server: Server, mode: str) -> None:
    """qa/L0_backend_python/argument_validation: pybind11's TypeError for an argument of a wrong type
    (None included), TritonModelException for an empty tensor in a list, and the calls that are fine."""
    report = _report(server, f"arguments_{mode}")
    assert {name: report[name][0] for name in TYPE_ERRORS} == dict.fromkeys(TYPE_ERRORS, "TypeError")
    assert {name: report[name] for name in MODEL_EXCEPTIONS} == {
        name: ["TritonModelException", text] for name, text in MODEL_EXCEPTIONS.items()}
    assert report["tensor_dlpack_none"][0] == report["tensor_dlpack_empty_name"][0] == "TritonModelException"
    assert report["request_correlation_ids"] == ["ok", [5, "id-5", 0]]
    assert report["response_outputs"] == ["ok", 1]
    for fine in ("request_empty_lists", "response_outputs_empty", "log_unspecified_level"):
        assert report[fine] == ["ok", None], fine
    assert report["tensor_name_none"][1] == (  # pybind11's text
        "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
        "    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n\n"
        "Invoked with: None, array([1, 2], dtype=int32)")
    assert report["log_level_int"][1].startswith("log(): incompatible function arguments.")


@pytest.mark.parametrize("mode", MODES)
def test_custom_metrics_as_tritons_qa_checks_them(server: Server, mode: str) -> None:
    """qa/python_models/custom_metrics: a family made twice with the same name and kind is one family
    (the first description stays), the same labels give the same series and other label names a
    series of their own; histogram buckets are required, strictly increasing (an empty list is fine),
    and exposed with Triton's ``le`` values (``1``, not ``1.0``)."""
    name = f"metrics_{mode}"
    report = _report(server, name)
    refused = "TritonModelException"
    assert report == {
        "same_series": [7.5, 0.0], "no_labels": ["ok", None], "other_labels": ["ok", None],
        "other_kind": [refused, "Error when creating MetricFamily: Family name already exists with different type"],
        "bad_name": [refused, "Error when creating MetricFamily: Invalid metric name"],
        "no_buckets": [refused, "Failed to create metric. Missing required buckets."],
        "buckets_none": [refused, "Failed to create metric. Missing required buckets."],
        "unsorted": [refused, "Error when creating Metric: Bucket Boundaries must be strictly sorted"],
        "duplicates": [refused, "Error when creating Metric: Bucket Boundaries must be strictly sorted"],
        "empty": ["ok", None]}
    text = metrics_text(server.metrics_port)
    assert text.count(f"# TYPE {name}_dup ") == 1 and f"# HELP {name}_dup dup description\n" in text
    assert "second description" not in text
    for line in (f'{name}_dup{{key="label1"}} 7.5', f'{name}_dup{{key="label2"}} 0.0', f"{name}_dup 0.0",
                 f'{name}_dup{{a="1",b="2"}} 0.0', f"{name}_histogram_bucket{{le=\"+Inf\"}} 0.0"):
        assert f"\n{line}\n" in text, line
    labels = 'example1="h1",example2="h2"'
    for le, count in (("0.1", 1), ("1", 1), ("2.5", 2), ("5", 2), ("10", 3), ("+Inf", 3)):
        assert f'\n{name}_histogram_bucket{{{labels},le="{le}"}} {count}.0\n' in text, le
    assert f"\n{name}_histogram_count{{{labels}}} 3.0\n" in text
    assert f"\n{name}_histogram_sum{{{labels}}} 7.55\n" in text


@pytest.mark.parametrize("mode", MODES)
def test_a_metric_used_after_its_family_is_deleted_is_refused(server: Server, mode: str) -> None:
    """qa/python_models/custom_metrics test_metric_lifetime_error: once model code deletes its
    ``MetricFamily``, the family's metrics refuse every operation with Triton's text, and their series
    leave ``/metrics``."""
    name = f"lifetime_{mode}"
    gone = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
            "object should be deleted AFTER its corresponding 'Metric' objects have been deleted.")
    assert _report(server, name) == {
        "counter": [f"Failed to increment metric value: {gone}", f"Failed to get metric value: {gone}",
                    f"Failed to set metric value: {gone}"],
        "gauge": [f"Failed to increment metric value: {gone}", f"Failed to get metric value: {gone}",
                  f"Failed to set metric value: {gone}"]}
    text = metrics_text(server.metrics_port)
    assert f"{name}_counter" not in text and f"{name}_gauge" not in text


@pytest.mark.parametrize("mode", MODES)
def test_async_execute_iterating_decoupled_bls_responses_serves_requests_together(server: Server, mode: str) -> None:
    """qa/L0_backend_python/async_execute test_concurrent_execute_multi_request_bls: 4 requests to an
    ``async def execute`` that iterates its decoupled BLS call's responses as soon as ``async_exec``
    returns; each call waits 2 s, and the 4 answers all come within 6 s (one at a time: 8 s)."""
    wait = np.full((1, 1), 2.0, np.float32)
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error if error is not None else result))
        try:
            began = time.monotonic()
            for _ in range(4):
                client.async_stream_infer(f"async_bls_{mode}", [infer_input(grpcclient, "WAIT_SECONDS", wait, "FP32")])
            got = [answers.get(timeout=30) for _ in range(4)]
            took = time.monotonic() - began
        finally:
            client.stop_stream(cancel_requests=True)
    assert not [item for item in got if isinstance(item, Exception)], got
    assert [item.as_numpy("DUMMY_OUT").shape for item in got] == [(1,)] * 4
    assert took < 6.0, took


@pytest.mark.parametrize("model", ["async_decoupled", "async_decoupled_process"])
def test_an_exception_in_a_background_async_execute_is_logged_and_the_model_serves_on(server: Server, model: str) -> None:
    """qa/L0_backend_python/async_execute test_model_raise_exception: the model ends its request and
    raises; the error is in the server log (its instance named), and the next request is answered."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error if error is not None else result))
        try:
            client.async_stream_infer(model, [infer_input(grpcclient, "WAIT_SECONDS", np.full((1, 1), -1.0, np.float32),
                                                      "FP32")])
            wait_until(lambda: f"python model '{model}_0_0' failed to execute" in server.log(), "the error logged")
            client.async_stream_infer(model, [infer_input(grpcclient, "WAIT_SECONDS", np.zeros((1, 1), np.float32), "FP32")])
            answer = answers.get(timeout=30)
        finally:
            client.stop_stream(cancel_requests=True)
    assert not isinstance(answer, Exception), answer
    assert "ValueError: wait_secs cannot be negative" in server.log()
