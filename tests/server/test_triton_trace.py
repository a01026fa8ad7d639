"""Triton's trace mode (qa/L0_trace): --trace-config, Triton's JSON trace file and the trace settings
as trace_endpoint_test.py checks them, through a real server and unmodified tritonclient."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from helpers import EXAMPLES, add_model, identity_model, start_server, wait_until

STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
          "REQUEST_END"]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The example repository traced in Triton's mode, as L0_trace starts Triton."""
    folder = tmp_path_factory.mktemp("trace")
    server = start_server(EXAMPLES, folder, "--trace-config", f"triton,file={folder / 'trace.json'}",
                          "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1")
    yield server, folder / "trace.json"
    assert server.stop() == 0


def read_traces(path: Path, count: int, timeout: float = 30) -> dict[int, list[dict]]:
    """The trace file's entries by trace id, once it holds at least ``count`` traces."""
    def traces() -> dict[int, list[dict]] | None:
        entries = json.loads(path.read_text()) if path.exists() else []  # the file is whole JSON after every write
        by_id: dict[int, list[dict]] = {}
        for entry in entries:
            by_id.setdefault(entry["id"], []).append(entry)
        return by_id if len(by_id) >= count else None

    return wait_until(traces, f"{count} traces in {path.name}", timeout)


def stamps(trace: list[dict]) -> list[tuple[str, int]]:
    return [(e["timestamps"][0]["name"], e["timestamps"][0]["ns"]) for e in trace if "timestamps" in e]


def simple_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor, data in zip(inputs, (a, b), strict=True):
        tensor.set_data_from_numpy(data)
    return inputs


def test_trace_file_holds_each_requests_timestamps_in_order_and_tensors_at_tensors_level(traced) -> None:
    server, path = traced
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)
    with grpcclient.InferenceServerClient(server.url) as rpc, httpclient.InferenceServerClient(server.http_url) as http:
        for number in range(3):
            rpc.infer("simple", simple_inputs(grpcclient, a, b), request_id=f"grpc-{number}")
            http.infer("simple", simple_inputs(httpclient, a, b), request_id=f"http-{number}")
        traces = read_traces(path, 6)
        assert sorted(trace[0]["request_id"] for trace in traces.values()) == sorted(
            [f"grpc-{n}" for n in range(3)] + [f"http-{n}" for n in range(3)])
        for trace_id, trace in traces.items():
            assert trace[0] == {"id": trace_id, "model_name": "simple", "model_version": 1,
                                "request_id": trace[0]["request_id"]}
            names, times = zip(*stamps(trace), strict=True)
            assert list(names) == STAMPS and list(times) == sorted(times) and times[-1] > times[0]
            assert not any("activity" in entry for entry in trace)  # TIMESTAMPS only
        http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
        try:
            rpc.infer("simple", simple_inputs(grpcclient, a, b), request_id="tensors")
            http.infer("simple_ensemble", [_fp32(httpclient, n, d) for n, d in (("INPUT0", a + 0.4), ("INPUT1", b))],
                       request_id="ensemble")
            traces = read_traces(path, 10)  # the ensemble's trace and one per step
        finally:
            http.update_trace_settings(settings={"trace_level": None})
    by_request = {trace[0].get("request_id"): trace for trace in traces.values()}
    tensors = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in by_request["tensors"] if "activity" in e}
    as_text = ",".join
    assert tensors == {
        ("TENSOR_QUEUE_INPUT", "INPUT0"): {"name": "INPUT0", "data": as_text(map(str, range(16))), "shape": "1,16", "dtype": "INT32"},
        ("TENSOR_QUEUE_INPUT", "INPUT1"): {"name": "INPUT1", "data": as_text(["1"] * 16), "shape": "1,16", "dtype": "INT32"},
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"): {"name": "OUTPUT0", "data": as_text(map(str, range(1, 17))), "shape": "1,16",
                                               "dtype": "INT32"},
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT1"): {"name": "OUTPUT1", "data": as_text(map(str, range(-1, 15))), "shape": "1,16",
                                               "dtype": "INT32"},
    }
    assert [name for name, _ in stamps(by_request["tensors"])] == STAMPS
    ensemble = by_request["ensemble"][0]
    steps = [trace[0] for trace in traces.values() if trace[0].get("parent_id") == ensemble["id"]]
    assert ensemble["model_name"] == "simple_ensemble"
    assert sorted(step["model_name"] for step in steps) == ["preprocess_round", "simple"]


def _fp32(module, name: str, data: np.ndarray):
    tensor = module.InferInput(name, [1, 16], "FP32")
    tensor.set_data_from_numpy(data.astype(np.float32))
    return tensor


def test_trace_settings_as_trace_endpoint_test_checks_them(traced) -> None:
    server, path = traced
    initial = {"trace_file": str(path), "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
               "log_frequency": "0", "trace_mode": "triton"}
    with grpcclient.InferenceServerClient(server.url) as rpc, httpclient.InferenceServerClient(server.http_url) as http:
        assert http.get_trace_settings() == http.get_trace_settings(model_name="simple") == initial
        expected = {name: {"value": value if isinstance(value, list) else [value]} for name, value in initial.items()}
        assert rpc.get_trace_settings(as_json=True)["settings"] == expected
        assert rpc.get_trace_settings(model_name="simple", as_json=True)["settings"] == expected
        for client in (http, rpc):
            with pytest.raises(InferenceServerException) as err:
                client.get_trace_settings(model_name="does-not-exist")
            assert "Request for unknown model : does-not-exist" in err.value.message()
        with pytest.raises(InferenceServerException, match="trace file location can not be updated through network protocol"):
            http.update_trace_settings(model_name="simple", settings={"trace_file": "model.log"})
        assert http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]}) == {
            **initial, "trace_level": ["TIMESTAMPS", "TENSORS"]}
        assert http.get_trace_settings(model_name="simple")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
        clear = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}
        http.update_trace_settings(settings=clear)
        # test_http_clear_settings: a model's own settings stay, the rest follows the global ones
        http.update_trace_settings(model_name="simple", settings={"trace_rate": "12", "log_frequency": "34"})
        http.update_trace_settings(settings={"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]})
        assert http.update_trace_settings(settings={"trace_rate": None, "trace_count": None}) == {
            **initial, "trace_level": ["OFF"]}
        assert http.get_trace_settings(model_name="simple") == {**initial, "trace_level": ["OFF"], "trace_rate": "12",
                                                                 "log_frequency": "34"}
        assert rpc.update_trace_settings(model_name="simple", settings={"trace_rate": None, "trace_level": None},
                                         as_json=True)["settings"]["log_frequency"] == {"value": ["34"]}
        assert http.get_trace_settings(model_name="simple") == {**initial, "trace_level": ["OFF"], "log_frequency": "34"}
        http.update_trace_settings(model_name="simple", settings=clear)
        http.update_trace_settings(settings=clear)
        assert http.get_trace_settings() == http.get_trace_settings(model_name="simple") == initial


def test_log_frequency_writes_numbered_files_and_exit_writes_the_rest(tmp_path) -> None:
    repository = tmp_path / "models"
    add_model(repository, "ident", identity_model(TensorProto.FLOAT, [1, 4]))
    path = tmp_path / "trace.json"
    server = start_server(repository, tmp_path, "--trace-config", f"triton,file={path}", "--trace-config", "rate=1",
                          "--trace-config", "level=TIMESTAMPS", "--trace-config", "triton,log-frequency=2")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            for _ in range(3):
                client.infer("ident", [tensor])
            assert client.get_trace_settings(as_json=True)["settings"]["log_frequency"] == {"value": ["2"]}
        first = read_traces(path.with_name("trace.json.0"), 2)
        assert [trace[0]["model_name"] for trace in first.values()] == ["ident", "ident"]
        assert not path.with_name("trace.json.1").exists()  # the third waits for a second one
    finally:
        assert server.stop() == 0
    assert len(read_traces(path.with_name("trace.json.1"), 1)) == 1  # written at exit
    assert not path.exists()


def test_default_trace_mode_is_tritons_and_traces_nothing_without_a_file(tmp_path) -> None:
    repository = tmp_path / "models"
    add_model(repository, "ident", identity_model(TensorProto.FLOAT, [1, 4]))
    server = start_server(repository, tmp_path, "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.get_trace_settings() == {"trace_file": "", "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                                   "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            client.infer("ident", [tensor])
            assert client.get_trace_settings()["trace_count"] == "-1"
    finally:
        assert server.stop() == 0
    assert not list(tmp_path.glob("*.json*"))


def test_opentelemetry_mode_through_trace_config(collector, tmp_path) -> None:
    """--trace-config mode=opentelemetry with Triton's own settings exports spans as --trace-otlp-endpoint does."""
    endpoint, spans = collector
    repository = tmp_path / "models"
    add_model(repository, "ident", identity_model(TensorProto.FLOAT, [1, 4]))
    server = start_server(repository, tmp_path, "--trace-config", "mode=opentelemetry", "--trace-config",
                          f"opentelemetry,url={endpoint.removeprefix('http://')}", "--trace-config", "level=TIMESTAMPS",
                          "--trace-config", "rate=1", "--trace-config", "opentelemetry,resource=service.name=triton-test")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.get_trace_settings() == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                                                   "trace_mode": "opentelemetry", "url": endpoint}
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            client.infer("ident", [tensor])
    finally:
        assert server.stop() == 0  # the exporter flushes on exit
    assert [s.name for s in spans if s.name == "ModelInfer"] == ["ModelInfer"]
