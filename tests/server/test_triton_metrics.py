"""Triton's CPU metrics and --metrics-config (qa/L0_metrics cpu_metrics_test.py, metrics_config_test.py)
through a real server: the families /metrics has, their values, and how each setting changes them."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto
from prometheus_client.parser import text_string_to_metric_families

from helpers import ROOT, add_model, identity_model, metrics_text, start_server

CPU = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")
COUNTERS = ("nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
            "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us")
SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us", "nv_inference_compute_input_summary_us",
             "nv_inference_compute_infer_summary_us", "nv_inference_compute_output_summary_us")
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
LABELS = {"model": "ident", "version": "1"}


def families(server) -> dict:
    """The metric families of /metrics on the metrics port, parsed with prometheus-client's parser."""
    return {family.name: family for family in text_string_to_metric_families(metrics_text(server.metrics_port))}


def sample(found: dict, family: str, name: str | None = None, **labels: str) -> float:
    matches = [s.value for s in found[family].samples if s.name == (name or family) and s.labels == labels]
    assert len(matches) == 1, (family, name, labels, found[family].samples)
    return matches[0]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("models")
    add_model(repository, "ident", identity_model(TensorProto.FLOAT, [None, 4]),
              config='name: "ident"\nmax_batch_size: 8\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
                     'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]\n')
    return repository


def infer(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    client.infer("ident", [tensor])


def test_cpu_metrics_are_in_range_and_move_under_load(repository, tmp_path) -> None:
    server = start_server(repository, tmp_path, "--metrics-interval-ms", "100")
    busy = threading.Event()
    try:
        found = families(server)
        utilization, total, used = (sample(found, name) for name in CPU)
        assert 0 <= utilization <= 1 and 0 < used <= total
        assert all(found[name].type == "gauge" for name in CPU)
        # Triton's defaults: the latency counters, no summaries, no first-response histogram
        assert set(COUNTERS) <= set(found) and not set(SUMMARIES) & set(found) and FIRST_RESPONSE not in found

        def load() -> None:
            with grpcclient.InferenceServerClient(server.url) as client:
                while not busy.is_set():
                    infer(client)

        worker = threading.Thread(target=load)
        worker.start()
        seen: dict[str, set[float]] = {name: set() for name in CPU}
        deadline = time.monotonic() + 60
        while len(seen["nv_cpu_utilization"]) < 3 or len(seen["nv_cpu_memory_used_bytes"]) < 2:
            assert time.monotonic() < deadline, seen  # the readings follow the machine, interval by interval
            found = families(server)
            for name in CPU:
                seen[name].add(sample(found, name))
            time.sleep(0.15)
        busy.set()
        worker.join()
        assert all(0 <= value <= 1 for value in seen["nv_cpu_utilization"])
        assert len(seen["nv_cpu_memory_total_bytes"]) == 1 and max(seen["nv_cpu_memory_used_bytes"]) <= total
    finally:
        busy.set()
        assert server.stop() == 0


def test_metrics_config_changes_the_latency_families(repository, tmp_path) -> None:
    requests = 5
    server = start_server(repository, tmp_path, "--allow-cpu-metrics", "false",
                          "--metrics-config", "summary_latencies=true", "--metrics-config", "counter_latencies=false",
                          "--metrics-config", "summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001",
                          "--metrics-config", "histogram_latencies=true", "--metrics-config", "summary_max_age=3")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            for _ in range(requests):
                infer(client)
        found = families(server)
        assert not set(CPU) & set(found) and not set(COUNTERS) & set(found)
        assert sample(found, "nv_inference_request_success", **LABELS) == requests  # the counts stay
        for name in SUMMARIES:
            assert found[name].type == "summary"
            assert sample(found, name, f"{name}_count", **LABELS) == requests
            assert sample(found, name, f"{name}_sum", **LABELS) > 0
            quantiles = {s.labels["quantile"]: s.value for s in found[name].samples if "quantile" in s.labels}
            assert list(quantiles) == ["0.5", "0.9", "0.99"]
            assert 0 < quantiles["0.5"] <= quantiles["0.9"] <= quantiles["0.99"]
        total_us = sample(found, SUMMARIES[0], f"{SUMMARIES[0]}_sum", **LABELS)
        histogram = found[FIRST_RESPONSE]
        assert histogram.type == "histogram"
        assert {s.labels["le"] for s in histogram.samples if "le" in s.labels} == {"100.0", "500.0", "2000.0", "5000.0", "+Inf"}
        assert sample(found, FIRST_RESPONSE, f"{FIRST_RESPONSE}_count", **LABELS) == requests
        assert sample(found, FIRST_RESPONSE, f"{FIRST_RESPONSE}_sum", **LABELS) == pytest.approx(total_us / 1000)
        # summary_max_age=3: once the window has passed, the quantiles have no observation left
        deadline = time.monotonic() + 60
        while not math.isnan(sample(found := families(server), SUMMARIES[0], **LABELS, quantile="0.5")):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert sample(found, SUMMARIES[0], f"{SUMMARIES[0]}_count", **LABELS) == requests
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("args, text", [
    (("--metrics-config", "summary_latencies"), "--metrics-config option format is <setting>=<value>"),
    (("--metrics-config", "summary_quantiles=0.5"), "invalid pair '0.5'"),
    (("--metrics-config", "no_such_setting=1"), "unknown --metrics-config setting 'no_such_setting'"),
    (("--metrics-interval-ms", "0"), "--metrics-interval-ms must be > 0"),
])
def test_bad_metrics_flags_are_usage_errors(repository, args, text) -> None:
    done = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and text in done.stderr
