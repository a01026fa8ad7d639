"""The dynamic batcher's priorities, queue policies and preserve_ordering (Triton's model_configuration.md and
schedule-policy extension; its qa/L0_model_queue), through a real server and unmodified tritonclient, gRPC and REST.

Each test first occupies the model's one instance with a request of many rows that runs for a few seconds (a
model timed on this host), then queues one-row requests behind it one at a time (each seen in flight before the
next is sent), so that the order in which the batcher takes them is what the assertions read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import add_model, pending, start_server, timed_matmul_model, wait_pending, wait_until

WIDTH, ROWS = 1024, 256  # a request of ROWS rows runs for about BLOCK_S; one of one row some 20 times less
BLOCK_S = 2.5
PROTOCOLS = ("grpc", "http")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    model = timed_matmul_model(WIDTH, ROWS, BLOCK_S)
    # preferred_batch_size 1: the one-row requests queued behind the blocking one run one by one, in queue order
    one = f"max_batch_size: {ROWS}\ninstance_group [{{ kind: KIND_CPU count: 1 }}]\ndynamic_batching {{ preferred_batch_size: [1] "
    for name, batching in (
            ("priorities", "priority_levels: 2 default_priority_level: 2"),
            ("override", "default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: true }"),
            ("no_override", "default_queue_policy { default_timeout_microseconds: 60000000 }"),
            ("delay", "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000 "
                      "allow_timeout_override: true }"),
            ("levels", "priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 2 } "
                       "priority_queue_policy { key: 1 value { max_queue_size: 1 } }")):
        add_model(repository, name, model, one + batching + " }")
    two = f"max_batch_size: {ROWS}\ninstance_group [{{ kind: KIND_CPU count: 2 }}]\n"
    for name, batching in (("ordered", "preserve_ordering: true"), ("unordered", "")):
        add_model(repository, name, model, f"{two}dynamic_batching {{ {batching} }}")
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


Answer = tuple[float, InferenceServerException | None]  # when it came back (perf_counter), and its error if any


def _infer(server, protocol: str, model: str, rows: int = 1, **options: int) -> Answer:
    """One request from its own client (tritonclient's HTTP client is not for several threads)."""
    module = grpcclient if protocol == "grpc" else httpclient
    tensor = module.InferInput("INPUT0", [rows, WIDTH], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, WIDTH), np.float32))
    outputs = [module.InferRequestedOutput("OUTPUT0")]  # binary over REST too: the many rows' JSON is slow to read
    with module.InferenceServerClient(server.url if protocol == "grpc" else server.http_url) as client:
        try:
            result = client.infer(model, [tensor], outputs=outputs, **options)
        except InferenceServerException as err:
            return time.perf_counter(), err
        done = time.perf_counter()
    assert result.as_numpy("OUTPUT0").shape == (rows, WIDTH)
    return done, None


def _queued(server, model: str, calls: list[Callable[[], Answer]], leaves: bool = False) -> list[Answer]:
    """Run ``calls`` in order, each seen in flight in the server before the next is sent, and wait for them
    all; the first occupies the model's instance, the others queue behind it. ``leaves``: the last may be
    rejected soon after it queues (so the in-flight count is not checked once all are sent)."""
    wait_until(lambda: pending(server, model) == 0, f"nothing of '{model}' in flight")
    with ThreadPoolExecutor(len(calls)) as threads:
        futures: list[Future[Answer]] = []
        for count, call in enumerate(calls, 1):
            futures.append(threads.submit(call))
            wait_pending(server, model, count)
        if not leaves:
            assert pending(server, model) == len(calls), "the first request ended before the others queued"
        return [f.result(timeout=120) for f in futures]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_higher_priority_sent_later_finishes_first(server, protocol: str) -> None:
    """Triton's L0_model_queue test_priority_levels: priority 1 overtakes queued priority 2 (and 99, beyond
    priority_levels, which runs at default_priority_level 2)."""
    answers = _queued(server, "priorities", [
        lambda: _infer(server, protocol, "priorities", ROWS),
        lambda: _infer(server, protocol, "priorities", priority=2),
        lambda: _infer(server, protocol, "priorities", priority=99),
        lambda: _infer(server, protocol, "priorities", priority=1)])
    assert all(error is None for _, error in answers)
    done = [when for when, _ in answers]
    assert done[3] < done[1] < done[2]


def _rejected_by_timeout(error: InferenceServerException | None, protocol: str) -> bool:
    expected = "StatusCode.UNAVAILABLE" if protocol == "grpc" else "503"
    return error is not None and error.message() == "Request timeout expired" and str(error.status()) == expected


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_timeout_rejects_only_where_the_policy_allows_an_override(server, protocol: str) -> None:
    """A 0.3 s ``timeout`` shortens the policy's 60 s one under ``allow_timeout_override`` (REJECT: Triton's
    text); without it the request waits its turn and runs."""
    for model, rejected in (("override", True), ("no_override", False)):
        answers = _queued(server, model, [lambda m=model: _infer(server, protocol, m, ROWS),
                                          lambda m=model: _infer(server, protocol, m),
                                          lambda m=model: _infer(server, protocol, m, timeout=300_000)], leaves=True)
        assert answers[0][1] is None and answers[1][1] is None
        assert _rejected_by_timeout(answers[2][1], protocol) is rejected, (model, answers[2][1])
        if rejected:  # at its timeout: long before the one queued ahead of it, which ran after the first
            assert answers[2][0] < answers[1][0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_delay_runs_a_late_request_after_those_still_in_time(server, protocol: str) -> None:
    """Triton's L0_model_queue test_policy_delay: past its timeout a request under DELAY is not rejected but
    goes behind the queue's unexpired requests."""
    answers = _queued(server, "delay", [lambda: _infer(server, protocol, "delay", ROWS),
                                        lambda: _infer(server, protocol, "delay", timeout=100_000),
                                        lambda: _infer(server, protocol, "delay")])
    assert all(error is None for _, error in answers)
    done = [when for when, _ in answers]
    assert done[2] < done[1]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_full_level_rejects_exactly_its_excess(server, protocol: str) -> None:
    """Triton's L0_model_queue test_max_queue_size, per level: level 1 holds 1, level 2 (the default) holds 2."""
    with ThreadPoolExecutor(8) as threads:
        first = threads.submit(_infer, server, protocol, "levels", ROWS)
        wait_pending(server, "levels", 1)
        high = [threads.submit(_infer, server, protocol, "levels", priority=1) for _ in range(3)]
        low = [threads.submit(_infer, server, protocol, "levels") for _ in range(4)]
        answers = [f.result(timeout=120) for f in (*high, *low)]
        assert first.result(timeout=120)[1] is None
    errors = [error for _, error in answers]
    full = "StatusCode.UNAVAILABLE" if protocol == "grpc" else "503"
    assert sum(e is not None for e in errors[:3]) == 2 and sum(e is not None for e in errors[3:]) == 2
    assert all(e.message().endswith("Exceeds maximum queue size") and str(e.status()) == full
               for e in errors if e is not None)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_preserve_ordering_answers_in_request_order_across_instances(server, protocol: str) -> None:
    """Two instances: a request of ROWS rows, then a 1-row one that runs on the other instance and ends far sooner.
    Without preserve_ordering its answer comes back first; with it, after the first one's."""
    def race(model: str) -> tuple[float, float, float]:
        with ThreadPoolExecutor(2) as threads:
            sent = time.perf_counter()
            big = threads.submit(_infer, server, protocol, model, ROWS)
            wait_pending(server, model, 1)
            small = threads.submit(_infer, server, protocol, model, 1)
            (big_done, big_error), (small_done, small_error) = big.result(timeout=120), small.result(timeout=120)
        assert big_error is None and small_error is None
        return big_done - sent, small_done - sent, big_done

    big_s, small_s, _ = race("unordered")
    assert small_s < big_s / 2  # the setup: the later request finishes first, and far sooner, on its own
    wait_until(lambda: pending(server, "ordered") == 0, "nothing in flight")
    big_s, small_s, _ = race("ordered")
    assert small_s > big_s / 2  # answered only once the earlier one was (slack for the transport of its many rows)


def test_server_metadata_lists_schedule_policy(server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        assert "schedule_policy" in client.get_server_metadata().extensions
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert "schedule_policy" in client.get_server_metadata()["extensions"]
