"""Drain on SIGTERM as documented: NOT_SERVING at once, Watch streams end, new requests turned away
with UNAVAILABLE / 503 + Retry-After, admitted requests (still uploading too) complete, prompt exit."""

from __future__ import annotations

import json
import queue
import signal
import socket
import threading
import time

import numpy as np
import psutil
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers import (EXAMPLES, add_model, http_in_flight, identity_model, start_server, timed_matmul_model,
                     wait_admitted, wait_until)

SIMPLE = {"inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for i in range(2)]}


def test_watch_gets_not_serving_then_ends_and_an_idle_server_exits_at_once(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path)  # --exit-timeout-secs stays at its 30 s default
    with grpc.insecure_channel(server.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = [stub.Watch(health_pb2.HealthCheckRequest(service=name)) for name in ("", "no.such.Service")]
        assert next(watches[0]).status == health_pb2.HealthCheckResponse.SERVING
        assert next(watches[1]).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert [m.status for m in watches[0]] == [health_pb2.HealthCheckResponse.NOT_SERVING]  # then the stream ends
        assert list(watches[1]) == []
        assert server.proc.wait(timeout=60) == 0
    assert time.monotonic() - started < 10, server.log()  # was the whole 30 s exit timeout


def _upload_start(port: int, body: bytes) -> socket.socket:
    """An infer request whose headers and first half of the body are sent; the rest is held back."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
    return sock


def _upload_finish(sock: socket.socket, body: bytes) -> bytes:
    sock.sendall(body[len(body) // 2:])
    data = b""
    while chunk := sock.recv(1 << 20):
        data += chunk
    sock.close()
    return data


def test_drain_finishes_uploads_and_turns_new_requests_away(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "identity", identity_model(1))  # FP32 [batch, n]
    # one instance, most of a second a request: the eight gRPC requests are admitted, most running, at SIGTERM
    add_model(repository, "slow", timed_matmul_model(1024, 256, 0.1), 'max_batch_size: 0\n'
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 1024] }]\ninstance_group [{ kind: KIND_CPU count: 1 }]')
    server = start_server(repository, tmp_path, "--exit-timeout-secs", "60", "--http-body-timeout-secs", "300")
    base = f"http://{server.http_url}"
    data = np.arange(500_000, dtype=np.float32).reshape(1, -1) / 7  # 2 MB as binary, ~5 MB as JSON
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": list(data.shape), "datatype": "FP32",
                                   "data": data.ravel().tolist()}]}).encode()
    uploads = [_upload_start(server.http_port, body) for _ in range(4)]
    wait_until(lambda: http_in_flight(server, "identity") == 4, "the four uploads to be admitted")
    grpc_results: queue.Queue = queue.Queue()
    rows = np.ones((256, 1024), dtype=np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        client.infer("identity", [tensor])  # connected and warm
        slow = grpcclient.InferInput("INPUT0", list(rows.shape), "FP32")
        slow.set_data_from_numpy(rows)
        keep_alive = requests.Session()
        assert keep_alive.get(f"{base}/v2/health/ready", timeout=30).status_code == 200  # an open keep-alive connection
        for _ in range(8):
            client.async_infer("slow", [slow], callback=lambda result, error: grpc_results.put((result, error)))
        assert wait_admitted(server.metrics_port, "slow", 8) >= 4  # all eight admitted, most still running
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "readiness off" in server.log(), "the drain to begin")
        # new requests during the drain: REST answers 503 + Retry-After (on a new or a kept-alive connection)
        for session in (requests, keep_alive):
            busy = session.post(f"{base}/v2/models/identity/infer", json=SIMPLE, timeout=30)  # type: ignore[attr-defined]
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1", busy.text
            assert "Server exiting" in busy.json()["error"]
        assert requests.get(f"{base}/v2/health/ready", timeout=30).status_code == 503
        assert requests.get(f"{base}/v2/health/live", timeout=30).status_code == 200
        with grpcclient.InferenceServerClient(server.url) as late:  # gRPC: new calls get UNAVAILABLE (0.2 s on)
            def refused() -> bool:
                try:
                    late.is_server_ready(client_timeout=10)
                    return False
                except InferenceServerException as err:
                    # a call that crosses the instant gRPC's shutdown begins is dropped by grpc core
                    # (CANCELLED, seen once in a CI run); the next one must be refused
                    if err.status() == "StatusCode.CANCELLED":
                        return False
                    assert err.status() == "StatusCode.UNAVAILABLE", err
                    return True
            wait_until(refused, "the gRPC port to refuse new calls", timeout=10)
        # the uploads that began before SIGTERM complete
        for sock in uploads:
            answer = _upload_finish(sock, body)
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"][0]["shape"] == list(data.shape)
        got = [grpc_results.get(timeout=60) for _ in range(8)]
    assert [error for _, error in got] == [None] * 8, [str(e) for _, e in got if e]
    for result, _ in got:
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), rows, rtol=1e-4)
    assert server.proc.wait(timeout=60) == 0
    assert "server stopped" in server.log()


def test_open_stream_does_not_hold_the_exit(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path)
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        client.async_stream_infer("simple", inputs)
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        exited = threading.Event()
        threading.Thread(target=lambda: (server.proc.wait(), exited.set()), daemon=True).start()
        assert exited.wait(timeout=20), "an idle open stream held the shutdown"
        client.stop_stream()
    assert server.proc.returncode == 0 and time.monotonic() - started < 20


def test_exit_timeout_bounds_a_rest_upload_that_never_ends(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--exit-timeout-secs", "2", "--http-body-timeout-secs", "300")
    body = json.dumps(SIMPLE).encode()
    stuck = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    stuck.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (len(body) + 10) + body)
    wait_until(lambda: http_in_flight(server, "simple") == 1, "the upload to be admitted")
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    assert time.monotonic() - started < 12  # 2 s, once, not the exit timeout twice or the body timeout
    stuck.close()


def test_stream_answers_what_it_read_then_ends(tmp_path) -> None:
    repository = tmp_path / "repo"
    config = ('max_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 1024] }]\n'
              'instance_group [{ kind: KIND_CPU count: 1 }]\n')
    add_model(repository, "slow", timed_matmul_model(1024, 256, 0.1), config)
    server = start_server(repository, tmp_path)
    results: queue.Queue = queue.Queue()
    data = np.ones((256, 1024), dtype=np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        client.infer("slow", [tensor])  # warm up
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for _ in range(3):
            client.async_stream_infer("slow", [tensor])
        assert wait_admitted(server.metrics_port, "slow", 1 + 3) >= 2  # read by the server, running one at a time
        server.proc.send_signal(signal.SIGTERM)
        got = [results.get(timeout=60) for _ in range(3)]
        client.stop_stream()
    assert [error for _, error in got] == [None] * 3, [str(e) for _, e in got if e]
    assert all(result.as_numpy("OUTPUT0").shape == data.shape for result, _ in got)
    assert server.proc.wait(timeout=60) == 0


def _wait_idle(process: psutil.Process) -> None:
    """Until the process spends under 20 ms of CPU in 0.25 s."""
    def spent() -> float:
        return sum(process.cpu_times()[:2])

    def idle() -> bool:
        before = spent()
        time.sleep(0.25)
        return spent() - before < 0.02

    wait_until(idle, "the server to be idle")


def test_stream_answers_a_message_still_decoding_at_the_drain(tmp_path) -> None:
    # a 20 MB message of 10 million unknown fields takes seconds to decode (a field at a time, on the
    # decode thread pool): SIGTERM while it decodes still answers it, as a message already read
    repository = tmp_path / "repo"
    add_model(repository, "identity", identity_model(1))  # FP32 [batch, n]
    server = start_server(repository, tmp_path)
    request = service_pb2.ModelInferRequest(model_name="identity", id="slow to decode")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    message = request.SerializeToString() + b"\x78\x00" * 10_000_000  # field 15, a varint: unknown, skipped
    process = psutil.Process(server.proc.pid)
    _wait_idle(process)  # what the server does after it says it is ready (lazy imports) is not decoding
    with grpc.insecure_channel(server.url) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        before = sum(process.cpu_times()[:2])
        replies = stream(iter([message]))
        # the server is idle but for this message: half a second of its CPU means it is decoding
        wait_until(lambda: sum(process.cpu_times()[:2]) - before > 0.5, "the message to be decoding")
        server.proc.send_signal(signal.SIGTERM)
        answers = [service_pb2.ModelStreamInferResponse.FromString(reply) for reply in replies]
    assert [answer.error_message for answer in answers] == [""], server.log()
    answer = answers[0].infer_response
    assert answer.id == "slow to decode" and answer.outputs[0].name == "OUTPUT0"
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [0, 1, 2, 3]
    assert server.proc.wait(timeout=60) == 0
