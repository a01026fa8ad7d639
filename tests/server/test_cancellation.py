"""Cancellation reaches the model: a request whose deadline passes stops its ONNX Runtime
execution (``RunOptions.terminate``), so the next request gets the instance at once instead of
waiting for a result no one will read. Before, the next request waited the whole execution out.
"""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from helpers import add_model, http_request, matmul_model, metrics_text, start_server, wait_pending

# 600 MatMuls of [rows, 512] x [512, 512] on one thread: seconds for 2,048 rows (3 s on a 2026 EPYC core, where
# 200 took 1 s, the gRPC test's deadline), milliseconds for one
SLOW = matmul_model(512, depth=600)
ONE_THREAD = 'parameters { key: "intra_op_thread_count" value { string_value: "1" } }'
CONFIGS = {
    "slow": f"max_batch_size: 0\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n{ONE_THREAD}\n"
            'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [-1, 512] }]\n',
    "slow_batched": f"max_batch_size: 4096\ndynamic_batching {{ }}\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n"
                    f"{ONE_THREAD}\n"
                    'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [512] }]\n'
                    'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [512] }]\n',
}
QUEUE_OF_ONE = (f"max_batch_size: 4096\ndynamic_batching {{ default_queue_policy {{ max_queue_size: 1 }} }}\n"
                f"instance_group [{{ count: 1, kind: KIND_CPU }}]\n{ONE_THREAD}\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    for name, config in CONFIGS.items():
        add_model(repository, name, SLOW, config)
    add_model(repository, "slow_queue", SLOW, QUEUE_OF_ONE)
    running = start_server(repository, tmp_path_factory.mktemp("logs"), "--max-request-decoded-bytes", "25000000",
                           "--request-memory-pool-bytes", "30000000")
    yield running
    assert running.stop() == 0


def _input(rows: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [rows, 512], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 512), np.float32))
    return [tensor]


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_an_expired_request_frees_the_instance(server, model) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    client.infer(model, _input(1), client_timeout=30)  # warm
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        client.infer(model, _input(2048), client_timeout=1.0)
    assert "Deadline" in str(err.value.status()) or "DEADLINE" in str(err.value.status())
    expired = time.monotonic()
    result = client.infer(model, _input(1), client_timeout=30)
    waited = time.monotonic() - expired
    assert np.allclose(result.as_numpy("OUTPUT0"), 1.0, atol=1e-3)
    # the 2,048-row execution alone takes several seconds; terminated, the instance is free in ~0.1 s
    assert waited < 2.5, f"the next request waited {waited:.2f} s after the first expired ({expired - started:.2f} s)"


def test_an_expired_request_leaves_the_batch_queue_at_once(server) -> None:
    """Queue of one: a queued request whose deadline passed must not hold the place of the next one."""
    client = grpcclient.InferenceServerClient(server.url)
    running: list[object] = []
    client.async_infer("slow_queue", _input(2048), lambda result, error: running.append(error), client_timeout=3)
    wait_pending(server, "slow_queue", 1)  # the 2,048 rows run on the only instance
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow_queue", _input(1), client_timeout=0.5)  # queued, then expired
    assert "DEADLINE" in str(err.value.status())
    result = client.infer("slow_queue", _input(1), client_timeout=30)  # before: "Exceeds maximum queue size"
    assert np.allclose(result.as_numpy("OUTPUT0"), 1.0, atol=1e-3)


def test_the_request_memory_pool_refuses_what_does_not_fit(server) -> None:
    """30 MB pool: while a 4 MB gRPC request runs (costed 5 times its message: ~21 MB), a second one,
    or a 4 MB REST one (3 times its binary data: ~12.6 MB), is UNAVAILABLE (503 + Retry-After over
    HTTP, as a full queue); a small one still runs."""
    client = grpcclient.InferenceServerClient(server.url)
    done: list[object] = []
    client.async_infer("slow", _input(2048), lambda result, error: done.append(error), client_timeout=3)
    wait_pending(server, "slow", 1)  # admitted: its share of the pool is taken
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow", _input(2048), client_timeout=30)
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert "--request-memory-pool-bytes" in err.value.message()
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2048, 512],
                                   "parameters": {"binary_data_size": 2048 * 512 * 4}}]}).encode()
    refused = http_request(server, "/v2/models/slow/infer", content=body + bytes(2048 * 512 * 4),
                           headers={"Inference-Header-Content-Length": str(len(body))}, timeout=30)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert client.infer("slow", _input(1), client_timeout=30).as_numpy("OUTPUT0").shape == (1, 512)
    with pytest.raises(InferenceServerException) as err:  # over the 25 MB per-request limit, whatever runs
        client.infer("slow", _input(4096), client_timeout=30)
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def _rest_infer(rows: int) -> tuple[bytes, bytes]:
    """(JSON header, whole body) of a binary REST infer of ``rows`` rows of ones."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 512],
                                     "parameters": {"binary_data_size": rows * 512 * 4}}]}).encode()
    return header, header + np.ones((rows, 512), np.float32).tobytes()


def _rest_post(server, model: str, rows: int) -> dict:
    header, body = _rest_infer(rows)
    reply = http_request(server, f"/v2/models/{model}/infer", content=body,
                         headers={"Inference-Header-Content-Length": str(len(header))})
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_a_rest_client_that_disconnects_frees_the_instance(server, model) -> None:
    """The REST twin of the expired gRPC request: the client closes its connection while the model
    runs; the execution is terminated and the next request is answered at once. Before, it waited
    for the whole 2,048-row execution."""
    _rest_post(server, model, 1)  # warm
    header, body = _rest_infer(2048)
    with socket.create_connection(("127.0.0.1", server.http_port)) as connection:
        connection.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
                           f"Inference-Header-Content-Length: {len(header)}\r\n\r\n".encode() + body)
        wait_pending(server, model, 1)  # decoded and running on the only instance
        connection.setblocking(False)
        with pytest.raises(BlockingIOError):  # no answer yet: running (not refused by the memory pool)
            connection.recv(1)
    gone = time.monotonic()
    answer = _rest_post(server, model, 1)
    waited = time.monotonic() - gone
    assert np.allclose(answer["outputs"][0]["data"], 1.0, atol=1e-3)
    assert waited < 2.5, f"the next request waited {waited:.2f} s after the client disconnected"
    assert "Exception in ASGI application" not in server.log()  # the cancellation ends the request quietly
    metrics = metrics_text(server.http_port)
    assert f'http_requests_total{{method="POST",model="{model}",path="/v2/models/{{model}}/infer",status="499"}}' in metrics
