"""Process lifecycle: graceful SIGTERM with requests in flight, large messages, startup failures."""

from __future__ import annotations

import queue
import re
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers import (EXAMPLES, add_model, matmul_model, slow_loading_model, start_server, wait_admitted, wait_pending,
                     wait_until)

SIZE = 1024
# Declaring the input keeps max_batch_size 0 (with no tensors named, auto-complete would batch).
NO_BATCHING = f'max_batch_size: 0\ninput [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, {SIZE}] }}]\n'


def test_sigterm_lets_in_flight_requests_finish_and_refuses_new_ones(tmp_path) -> None:
    repository = tmp_path / "repo"
    config = NO_BATCHING + ('instance_group [{ kind: KIND_CPU count: 1 }]\n'
                            'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')
    add_model(repository, "slow", matmul_model(SIZE, depth=40), config)
    server = start_server(repository, tmp_path)
    data = np.ones((512, SIZE), dtype=np.float32)  # 43 GFLOP a request: most of a second on one thread
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        client.infer("slow", [tensor])  # warm up
        for _ in range(6):
            client.async_infer("slow", [tensor], callback=lambda result, error: results.put((result, error)))
        # every request has reached the server, and most still run (the instance runs one at a time)
        assert wait_admitted(server.metrics_port, "slow", 1 + 6) >= 3, "requests finished too fast to be in flight"
        server.proc.send_signal(signal.SIGTERM)
        got = [results.get(timeout=60) for _ in range(6)]
    assert [error for _, error in got] == [None] * 6, [str(e) for _, e in got if e] + [server.log()]
    for result, _ in got:
        np.testing.assert_allclose(result.as_numpy("OUTPUT0")[:2, :2], np.ones((2, 2)), rtol=1e-4)
    with grpcclient.InferenceServerClient(server.url) as late:
        with pytest.raises(InferenceServerException) as err:
            late.infer("slow", [tensor], client_timeout=5)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert server.proc.wait(timeout=60) == 0
    log = server.log()
    assert "readiness off" in log and "server stopped" in log


def test_exit_timeout_bounds_the_drain(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "slow", matmul_model(SIZE, depth=40), NO_BATCHING + "instance_group [{ kind: KIND_CPU count: 1 }]")
    server = start_server(repository, tmp_path, "--exit-timeout-secs", "1")
    data = np.ones((512, SIZE), dtype=np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        for _ in range(40):  # far more work than one second
            client.async_infer("slow", [tensor], callback=lambda result, error: None)
        wait_pending(server, "slow", 10)  # seconds of work in flight, more coming
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 15


def test_256_mib_tensor_round_trip(client) -> None:
    """On the shared example server (its fixture checks that it exits cleanly at the end)."""
    data = np.random.default_rng(0).random((1, 64 * 1024 * 1024), dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    out = client.infer("identity_fp32", [tensor], client_timeout=120).as_numpy("OUTPUT0")
    assert out.shape == data.shape and np.array_equal(out, data)
    small = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    small.set_data_from_numpy(np.ones((1, 1), np.float32))
    assert client.infer("identity_fp32", [small]).as_numpy("OUTPUT0")[0, 0] == 1.0


def test_not_ready_while_startup_models_load(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "slow_to_load", slow_loading_model())
    server = start_server(repository, tmp_path, wait_startup=False)
    try:
        with grpcclient.InferenceServerClient(server.url) as client, grpc.insecure_channel(server.url) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert client.is_server_live()
            assert not client.is_server_ready()
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert [m.state for m in client.get_model_repository_index().models] in ([], ["LOADING"], [""])
            wait_until(client.is_server_ready, "startup loading to end")
            assert client.is_model_ready("slow_to_load")
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING
        log = server.log()
        assert re.search(r"loaded model 'slow_to_load' versions \[1\] in \d+\.\d ms \(RSS [+-]\d+\.\d MiB\)", log)
        assert "execution provider: CPU" in log or "execution provider: CUDA" in log
        assert "[E:onnxruntime" not in log and "Error" not in log, "CUDA detection must be quiet on CPU hosts"
    finally:
        assert server.stop() == 0


def test_empty_repository_is_live_but_not_ready(tmp_path) -> None:
    (tmp_path / "repo").mkdir()
    server = start_server(tmp_path / "repo", tmp_path)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_live() and not client.is_server_ready()
    finally:
        assert server.stop() == 0


def test_bad_command_lines_exit_non_zero(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="is not a directory"):
        start_server(tmp_path / "missing", tmp_path)
    with pytest.raises(RuntimeError, match="expected true or false"):
        start_server(EXAMPLES, tmp_path, "--strict-readiness", "maybe")


def test_json_logs_with_a_line_per_failed_request(tmp_path) -> None:
    import json

    server = start_server(EXAMPLES, tmp_path, "--log-format", "json")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            with pytest.raises(InferenceServerException):
                client.get_model_metadata("no_such_model")
        wait_until(lambda: "request failed" in server.log(), "the failed request's log line")
    finally:
        assert server.stop() == 0
    entries = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert entries and all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    assert any("loaded model 'simple'" in e["message"] for e in entries)
    failed = [e for e in entries if "request failed" in e["message"]]
    assert len(failed) == 1 and "NOT_FOUND" in failed[0]["message"] and "no_such_model" in failed[0]["message"]


def test_asyncio_event_loop_serves_and_drains(tmp_path) -> None:
    """uvloop is the default; the standard asyncio loop must work the same."""
    server = start_server(EXAMPLES, tmp_path, "--event-loop", "asyncio")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready()
            tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
            assert client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").tolist() == [[1.0, 1.0]]
    finally:
        assert server.stop() == 0
    assert "server stopped" in server.log()


def test_a_load_whose_client_gives_up_still_finishes(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "slow_to_load", slow_loading_model())
    server = start_server(repository, tmp_path, "--model-control-mode", "explicit")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
                client.load_model("slow_to_load", client_timeout=0.2)  # the load outlives its caller
            wait_until(lambda: client.is_model_ready("slow_to_load"), "the load to finish")
            assert [m.state for m in client.get_model_repository_index().models] == ["READY"], server.log()
            data = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            data.set_data_from_numpy(np.ones((1, 4), np.float32))
            assert client.infer("slow_to_load", [data]).as_numpy("OUTPUT0").shape == (1, 4)
    finally:
        assert server.stop() == 0
