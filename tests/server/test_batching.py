"""Dynamic batching with Triton's semantics, through a real server and tritonclient's asyncio client."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from onnx import TensorProto, helper

from helpers import (add_model, http_request, identity_model, make_model, pending, start_server, timed_matmul_model, wait_pending,
                     wait_until)

SLOW = 1024  # the width of the slow models: a batch of BLOCKING rows runs for about 0.7 s on any host
BLOCKING = 64


def _gather_model():
    """OUTPUT0 = [10, 20, 30, 40][INPUT0]: an index past 3 makes ONNX Runtime fail at run time."""
    table = helper.make_tensor("T", TensorProto.FLOAT, [4], [10, 20, 30, 40])
    model = make_model([helper.make_node("Gather", ["T", "INPUT0"], ["OUTPUT0"])],
                       [("INPUT0", TensorProto.INT64, [None, 1])], [("OUTPUT0", TensorProto.FLOAT, [None, 1])])
    model.graph.initializer.append(table)
    return model


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    one = "instance_group [{ kind: KIND_CPU count: 1 }]\n"
    add_model(repository, "delayed", identity_model(TensorProto.FLOAT, [None, 4]),
              "max_batch_size: 8\n" + one + "dynamic_batching { max_queue_delay_microseconds: 300000 }")
    add_model(repository, "preferred", identity_model(TensorProto.FLOAT, [None, 4]),
              "max_batch_size: 8\n" + one + "dynamic_batching { preferred_batch_size: [2] max_queue_delay_microseconds: 20000000 }")
    add_model(repository, "auto", identity_model(TensorProto.FLOAT, [None, 4]))
    add_model(repository, "gather", _gather_model(),
              "max_batch_size: 8\n" + one + "dynamic_batching { max_queue_delay_microseconds: 300000 }")
    slow = timed_matmul_model(SLOW, BLOCKING, 0.7)
    # "slow" blocks for 3 s: its test's 0.3 s deadline must pass while the batch still runs, even when a
    # loaded host makes the measured time of a trip wrong by 2x or more
    for name, policy, model in (("bounded", "max_queue_size: 8", slow),
                                ("timeout", "default_timeout_microseconds: 100000", slow),
                                ("slow", "", timed_matmul_model(SLOW, BLOCKING, 3.0))):
        add_model(repository, name, model,
                  f"max_batch_size: {BLOCKING}\n{one}dynamic_batching {{ default_queue_policy {{ {policy} }} }}")
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def _input(array: np.ndarray, datatype: str = "FP32") -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return [tensor]


def _stats(server, model: str) -> tuple[int, int]:
    with grpcclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics(model).model_stats[0]
    return stats.inference_count, stats.execution_count


def test_requests_merge_and_results_scatter_back(batching_server) -> None:
    async def run() -> list[np.ndarray]:
        async with aioclient.InferenceServerClient(batching_server.url) as client:
            calls = [client.infer("delayed", _input(np.full((1, 4), i, np.float32))) for i in range(6)]
            calls.append(client.infer("delayed", _input(np.full((2, 4), 99, np.float32))))
            return [r.as_numpy("OUTPUT0") for r in await asyncio.gather(*calls)]

    results = asyncio.run(run())
    for i in range(6):
        np.testing.assert_array_equal(results[i], np.full((1, 4), i, np.float32))
    np.testing.assert_array_equal(results[6], np.full((2, 4), 99, np.float32))
    inferences, executions = _stats(batching_server, "delayed")
    assert inferences == 8 and executions <= 2  # 8 rows in at most two batches of <= 8


def test_a_lone_request_waits_for_the_queue_delay(batching_server) -> None:
    with grpcclient.InferenceServerClient(batching_server.url) as client:
        started = time.monotonic()
        client.infer("delayed", _input(np.zeros((1, 4), np.float32)))
        assert time.monotonic() - started >= 0.3


def test_a_preferred_batch_size_dispatches_without_waiting_for_the_delay(batching_server) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(batching_server.url) as client:
            await asyncio.gather(*[client.infer("preferred", _input(np.ones((1, 4), np.float32))) for _ in range(2)])

    started = time.monotonic()
    asyncio.run(run())
    assert time.monotonic() - started < 10  # the delay is 20 s
    assert _stats(batching_server, "preferred") == (2, 1)


def test_batching_is_auto_enabled_for_batching_models(batching_server) -> None:
    with grpcclient.InferenceServerClient(batching_server.url) as client:
        config = client.get_model_config("auto", as_json=True)["config"]
    assert config["max_batch_size"] == 4 and config["dynamic_batching"] is not None


def test_a_failing_batch_fails_every_member_and_the_batcher_goes_on(batching_server) -> None:
    async def run() -> list:
        async with aioclient.InferenceServerClient(batching_server.url) as client:
            calls = [client.infer("gather", _input(np.array([[index]], np.int64), "INT64")) for index in (0, 1, 9)]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(run())
    # an index out of range fails inside ONNX Runtime on the request's values: INVALID_ARGUMENT for every member
    assert all(isinstance(r, aioclient.InferenceServerException) and r.status() == "StatusCode.INVALID_ARGUMENT"
               and "cannot compute on the values" in str(r) for r in results)
    with grpcclient.InferenceServerClient(batching_server.url) as client:
        result = client.infer("gather", _input(np.array([[2]], np.int64), "INT64"))
    assert result.as_numpy("OUTPUT0").tolist() == [[30.0]]


def _blocked(server, model: str, then) -> object:
    """Run ``then(client)`` while a batch of BLOCKING rows occupies the model's only instance."""
    async def run():
        async with aioclient.InferenceServerClient(server.url) as client:
            blocking = asyncio.ensure_future(client.infer(model, _input(np.ones((BLOCKING, SLOW), np.float32))))
            await asyncio.to_thread(wait_pending, server, model, 1)  # on the instance: the queue is empty
            try:
                return await then(client)
            finally:
                await blocking
    return asyncio.run(run())


def test_a_full_queue_rejects_exactly_the_excess(batching_server) -> None:
    """Triton's L0_model_queue: one running batch plus 10 requests, max_queue_size 8: exactly 2 rejected."""
    async def ten(client):
        calls = [client.infer("bounded", _input(np.ones((1, SLOW), np.float32))) for _ in range(10)]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = _blocked(batching_server, "bounded", ten)
    rejected = [r for r in results if isinstance(r, Exception)]
    assert len(rejected) == 2
    assert all("Exceeds maximum queue size" in str(r) and r.status() == "StatusCode.UNAVAILABLE" for r in rejected)


def test_a_full_queue_is_503_with_retry_after_over_http(batching_server) -> None:
    body = b'{"inputs": [{"name": "INPUT0", "shape": [1, 1024], "datatype": "FP32", "data": [' + b",".join([b"1"] * SLOW) + b"]}]}"

    async def flood(_):
        def post() -> tuple[int, str | None]:
            reply = http_request(batching_server, "/v2/models/bounded/infer", content=body)
            return reply.status_code, None if reply.is_success else reply.headers.get("Retry-After")
        with ThreadPoolExecutor(12) as pool:  # all twelve at once
            return await asyncio.gather(*[asyncio.get_running_loop().run_in_executor(pool, post) for _ in range(12)])

    answers = _blocked(batching_server, "bounded", flood)
    assert (503, "1") in answers and all(status in (200, 503) for status, _ in answers)


def test_queued_requests_past_the_policy_timeout_are_rejected(batching_server) -> None:
    async def late(client):
        return await asyncio.gather(client.infer("timeout", _input(np.ones((1, SLOW), np.float32))), return_exceptions=True)

    (result,) = _blocked(batching_server, "timeout", late)
    assert isinstance(result, Exception) and "Request timeout expired" in str(result)


def test_a_cancelled_request_never_reaches_the_model(batching_server) -> None:
    before = _stats(batching_server, "slow")

    async def cancelled(client):
        try:
            await client.infer("slow", _input(np.ones((3, SLOW), np.float32)), client_timeout=0.3)
        except aioclient.InferenceServerException as err:
            return err

    error = _blocked(batching_server, "slow", cancelled)
    assert "Deadline Exceeded" in str(error)
    wait_until(lambda: pending(batching_server, "slow") == 0, "the cancelled request to leave the server")
    with grpcclient.InferenceServerClient(batching_server.url) as client:  # queued behind anything left
        client.infer("slow", _input(np.ones((1, SLOW), np.float32)))
    after = _stats(batching_server, "slow")
    assert after[0] - before[0] == BLOCKING + 1  # the blocking batch and the last one: the 3 cancelled rows never ran
