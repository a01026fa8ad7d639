"""Prometheus metrics: Triton's families move by exactly what was sent; HTTP metrics by route pattern."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from tritonclient.utils import InferenceServerException

from helpers import (EXAMPLES, Samples, add_model, host_gpus, http_request, make_model, matmul_model, metric, metrics_text,
                     pending, scrape, start_server, wait_pending, wait_until)

GOOD, BAD = 7, 3


def deltas(before: Samples, after: Samples):
    """``delta(name, **labels)``: how far a series moved; it must exist after (before, it may not yet)."""
    def delta(name: str, **labels) -> float:
        return metric(after, name, **labels) - before.get((name, tuple(sorted(labels.items()))), 0.0)
    return delta


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def _simple_inputs(datatype: str = "INT32"):
    inputs = [grpcclient.InferInput(n, [2, 16], datatype) for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((2, 16), np.int32 if datatype == "INT32" else np.float32))
    return inputs


def test_triton_families_count_exactly_what_was_sent(server) -> None:
    simple = {"model": "simple", "version": "1"}
    before = scrape(server.metrics_port)
    with grpcclient.InferenceServerClient(server.url) as client:
        for _ in range(GOOD):
            client.infer("simple", _simple_inputs())
        for _ in range(BAD):
            with pytest.raises(InferenceServerException):
                client.infer("simple", _simple_inputs("FP32"))
    after = scrape(server.metrics_port)
    delta = deltas(before, after)
    assert delta("nv_inference_request_success", **simple) == GOOD
    assert delta("nv_inference_request_failure", **simple, reason="OTHER") == BAD
    assert delta("nv_inference_count", **simple) == 2 * GOOD  # batch elements
    assert delta("nv_inference_exec_count", **simple) == GOOD
    assert delta("nv_inference_request_latency_seconds_count", **simple) == GOOD
    for family in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert delta(f"nv_inference_{family}_duration_us", **simple) > 0, family
    assert metric(after, "nv_inference_pending_request_count", **simple) == 0
    # SIE's families describe the same requests
    assert delta("sie_requests_total", model="simple", endpoint="infer", status="ok") == GOOD
    assert delta("sie_requests_total", model="simple", endpoint="infer", status="error") == BAD
    for phase in ("queue", "tokenization", "inference", "postprocessing", "total"):
        assert delta("sie_request_duration_seconds_count", model="simple", endpoint="infer", phase=phase) == GOOD
    assert delta("sie_batch_size_count", model="simple") == GOOD and delta("sie_batch_size_sum", model="simple") == 2 * GOOD
    assert metric(after, "sie_queue_depth", model="simple") == 0
    gpus = host_gpus()
    device = "cuda:0" if gpus else "cpu"  # `simple` has no instance group: KIND_GPU where CUDA is usable
    assert metric(after, "sie_model_loaded", model="simple", device=device) == 1
    assert metric(after, "sie_model_memory_bytes", model="simple", device=device) >= 0
    # GPU families exactly on GPU hosts: one series per GPU
    assert len({labels for name, labels in after if name == "nv_gpu_memory_total_bytes"}) == gpus
    assert any(name.startswith("nv_gpu_") for name, _ in after) == bool(gpus)
    assert f"execution provider: {f'CUDA ({gpus} GPU)' if gpus else 'CPU (no usable GPU)'}" in server.log()
    assert metric(after, "process_resident_memory_bytes") > 10e6
    assert metric(after, "process_cpu_seconds_total") > 0


def test_a_loaded_version_has_its_series_at_0_before_any_request(tmp_path) -> None:
    """As Triton's model reporter: the counters and each failure reason exist from the load, the
    failure's labels in Triton's (sorted) order: model, reason, version."""
    repository = tmp_path / "repo"
    add_model(repository, "idle", make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                                             [("INPUT0", TensorProto.FLOAT, [None])],
                                             [("OUTPUT0", TensorProto.FLOAT, [None])]))
    server = start_server(repository, tmp_path / "logs")
    try:
        text = metrics_text(server.metrics_port)
    finally:
        assert server.stop() == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert f'nv_inference_request_failure{{model="idle",reason="{reason}",version="1"}} 0.0' in text, text
    for family in ("request_success", "count", "exec_count", "request_duration_us"):
        assert f'nv_inference_{family}{{model="idle",version="1"}} 0.0' in text, family


def test_http_metrics_use_route_patterns_and_skip_health(server) -> None:
    body = json.dumps({"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
                                  for n in ("INPUT0", "INPUT1")]}).encode()
    before = scrape(server.metrics_port)
    for path in ("/v2/models/simple/infer", "/v2/models/simple/infer", "/v2/models/no_such_model/infer"):
        assert http_request(server, path, content=body).status_code in (200, 404)
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/docs"):
        assert http_request(server, path).status_code == 200
    after = scrape(server.http_port)  # /metrics on the HTTP port too
    pattern = "/v2/models/{model}/infer"
    delta = deltas(before, after)

    assert delta("http_requests_total", method="POST", path=pattern, model="simple", status="200") == 2
    # a name the server does not know is labelled "unknown": clients cannot grow label cardinality
    assert delta("http_requests_total", method="POST", path=pattern, model="unknown", status="404") == 1
    assert delta("http_request_duration_seconds_count", method="POST", path=pattern, model="simple", status="200") == 2
    assert delta("http_request_body_bytes_count", method="POST", path=pattern, model="simple") == 2
    assert metric(after, "http_requests_in_flight", method="POST", path=pattern, model="simple") == 0
    paths = {dict(labels)["path"] for (name, labels) in after if name.startswith("http_") and "path" in dict(labels)}
    assert pattern in paths and "/v2/models/simple/infer" not in paths  # patterns, never concrete URIs
    assert not any("health" in p or "metrics" in p or "docs" in p for p in paths), paths


# Triton's names, kept on purpose so Triton dashboards work (README, Metrics): promtool flags the
# abbreviated unit "us" and the "_count" suffix on families that are not histograms or summaries.
TRITON_NAMES = {"nv_inference_count", "nv_inference_exec_count", "nv_inference_pending_request_count",
                "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                "nv_inference_compute_output_duration_us"}
ABBREVIATED_UNITS = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}


def lint(text: str) -> list[str]:
    """What ``promtool check metrics`` (client_golang's promlint) reports for a text exposition."""
    problems = []
    helps = set(re.findall(r"^# HELP (\S+) \S", text, re.MULTILINE))
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        if name not in helps:
            problems.append(f"{name}: no help text")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f"{name}: counter metrics should have \"_total\" suffix")
        if kind not in ("histogram", "summary") and name.endswith(("_count", "_sum", "_bucket")):
            problems.append(f"{name}: non-histogram and non-summary metrics should not have a {name.rsplit('_', 1)[1]} suffix")
        if ABBREVIATED_UNITS & set(name.split("_")):
            problems.append(f"{name}: metric names should not contain abbreviated units")
        if re.search(r"[A-Z]", name) or ":" in name:
            problems.append(f"{name}: metric names should be snake_case, without colons")
        if kind == "gauge" and name.endswith("_total"):
            problems.append(f"{name}: non-counter metrics should not have \"_total\" suffix")
    return problems


def test_openmetrics_when_asked_and_promtool_clean(server) -> None:
    assert http_request(server, "/v2/models/simple/infer", body={"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for n in ("INPUT0", "INPUT1")]}).status_code == 200
    reply = http_request(server, "/metrics",
                         headers={"Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"})
    assert reply.status_code == 200
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = reply.text
    families = {f.name: f for f in openmetrics_families(text)}  # prometheus-client's OpenMetrics parser
    assert families["http_requests"].type == "counter" and families["nv_inference_request_latency_seconds"].type == "histogram"
    assert text.endswith("# EOF\n") and "_created" not in text
    plain = metrics_text(server.metrics_port)  # no Accept
    assert "_created" not in plain and "# EOF" not in plain
    problems = lint(plain)
    assert {p.split(":")[0] for p in problems} == TRITON_NAMES, problems


def test_metrics_can_be_turned_off(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--allow-metrics", "false")
    try:
        assert server.metrics_port == 0 and "metrics server listening" not in server.log()
        assert http_request(server, "/metrics").status_code == 404
        with grpcclient.InferenceServerClient(server.url) as client:
            client.infer("simple", _simple_inputs())  # inference is unaffected
    finally:
        assert server.stop() == 0


def test_failures_are_counted_by_their_triton_reason(tmp_path) -> None:
    """``nv_inference_request_failure`` by ``reason``: a full queue is REJECTED, a request its client
    cancels (running or queued) is CANCELED, and ONNX Runtime failing the execution is BACKEND."""
    repository = tmp_path / "repo"
    # 128 rows of 400 MatMuls [128, 1024] x [1024, 1024] on one thread: many seconds unless cancelled
    add_model(repository, "slow", matmul_model(1024, depth=400),
              "max_batch_size: 128\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
              'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
              "dynamic_batching { default_queue_policy { max_queue_size: 1 } }")
    # ConstantOfShape of [2^31, 2^31] FP32: ORT fails the run (storage size overflow), nothing is allocated
    add_model(repository, "overflow", make_model([helper.make_node("ConstantOfShape", ["INPUT0"], ["OUTPUT0"])],
                                                 [("INPUT0", TensorProto.INT64, [2])],
                                                 [("OUTPUT0", TensorProto.FLOAT, [None, None])]),
              "max_batch_size: 0\ninstance_group [{ kind: KIND_CPU }]")  # the same failure on GPU hosts
    server = start_server(repository, tmp_path / "logs")

    def rows(count: int) -> list[grpcclient.InferInput]:
        tensor = grpcclient.InferInput("INPUT0", [count, 1024], "FP32")
        tensor.set_data_from_numpy(np.ones((count, 1024), np.float32))
        return [tensor]

    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            answers: list[object] = []
            running = client.async_infer("slow", rows(128), lambda result, error: answers.append(error))
            wait_pending(server, "slow", 1)  # on the only instance: the queue is empty again
            queued = client.async_infer("slow", rows(1), lambda result, error: answers.append(error))
            wait_pending(server, "slow", 2)  # waits in the queue of one
            with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
                client.infer("slow", rows(1))
            queued.cancel()
            running.cancel()
            wait_until(lambda: len(answers) == 2, "both cancelled calls to end")
            wait_until(lambda: pending(server, "slow") == 0, "the cancelled requests to leave the server")
            shape = grpcclient.InferInput("INPUT0", [2], "INT64")
            shape.set_data_from_numpy(np.array([2**31, 2**31], np.int64))
            with pytest.raises(InferenceServerException) as err:
                client.infer("overflow", [shape])
            assert err.value.status() == "StatusCode.INTERNAL"
        samples = scrape(server.metrics_port)
    finally:
        assert server.stop() == 0
    failures = {(dict(labels)["model"], dict(labels)["reason"]): value for (name, labels), value in samples.items()
                if name == "nv_inference_request_failure"}
    # every reason of every loaded version has its series, at 0 from the load, as in Triton
    assert set(failures) == {(model, reason) for model in ("slow", "overflow")
                             for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}, failures
    counted = {key: value for key, value in failures.items() if value}
    assert counted == {("slow", "REJECTED"): 1, ("slow", "CANCELED"): 2, ("overflow", "BACKEND"): 1}, counted
    assert metric(samples, "sie_requests_total", model="slow", endpoint="infer", status="error") == 3
