"""Cancellation reaches the model (issue 17): a request whose deadline passes stops its ONNX Runtime
execution (``RunOptions.terminate``), so the next request gets the instance at once instead of
waiting for a result no one will read. Before, the next request waited the whole execution out.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from helpers import add_model, matmul_model, start_server

# 200 MatMuls of [rows, 512] x [512, 512] on one thread: seconds for 2,048 rows, milliseconds for one
SLOW = matmul_model(512, depth=200)
ONE_THREAD = 'parameters { key: "intra_op_thread_count" value { string_value: "1" } }'
CONFIGS = {
    "slow": f"max_batch_size: 0\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n{ONE_THREAD}\n"
            'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [-1, 512] }]\n',
    "slow_batched": f"max_batch_size: 4096\ndynamic_batching {{ }}\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n"
                    f"{ONE_THREAD}\n"
                    'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [512] }]\n'
                    'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [512] }]\n',
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    for name, config in CONFIGS.items():
        add_model(repository, name, SLOW, config)
    running = start_server(repository, tmp_path_factory.mktemp("logs"))
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
