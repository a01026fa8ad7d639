"""The fleet drill's steady load (`make fleet-drill`): tritonclient gRPC and REST callers inferring Triton's
``simple`` through the balancer, each request's outcome and latency recorded.

Each caller is a thread with its own client, one request at a time, a pause between requests; it stops by
itself after ``max_requests`` requests or ``max_seconds``, or at ``stop()``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


@dataclass(frozen=True)
class Outcome:
    """One request: its transport ("grpc" or "rest"), when it started (time.monotonic()), its latency in
    seconds, and the error text when it failed (None when it succeeded with the right sums and differences)."""

    transport: str
    start: float
    seconds: float
    error: str | None


@dataclass(frozen=True)
class Summary:
    """Outcomes of a time window: requests, failures by distinct error text, latency percentiles in ms."""

    sent: int
    failed: int
    errors: dict[str, int]
    p50_ms: float
    p99_ms: float


def summarize(outcomes: list[Outcome]) -> Summary:
    """The Summary of ``outcomes`` (percentiles over every request, failed ones included; 0 when none)."""
    latencies = np.array([o.seconds for o in outcomes]) * 1000
    errors = Counter(o.error for o in outcomes if o.error is not None)
    p50, p99 = (np.percentile(latencies, [50, 99]) if len(latencies) else (0.0, 0.0))
    return Summary(len(outcomes), sum(errors.values()), dict(errors), float(p50), float(p99))


def one_line(text: str, limit: int = 200) -> str:
    """An error text on one line for a table: HTML tags (an HAProxy error page) and runs of white space become
    one space, ``|`` becomes ``/``; at most ``limit`` characters."""
    return " ".join(re.sub(r"<[^>]*>", " ", text).replace("|", "/").split())[:limit]


def _grpc_call(client: Any) -> None:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    result = client.infer("simple", inputs, client_timeout=30)
    if not (np.array_equal(result.as_numpy("OUTPUT0"), A + B) and np.array_equal(result.as_numpy("OUTPUT1"), A - B)):
        raise ValueError("wrong sums or differences")


def _rest_call(client: Any) -> None:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A, binary_data=True)
    inputs[1].set_data_from_numpy(B, binary_data=True)
    result = client.infer("simple", inputs)
    if not (np.array_equal(result.as_numpy("OUTPUT0"), A + B) and np.array_equal(result.as_numpy("OUTPUT1"), A - B)):
        raise ValueError("wrong sums or differences")


class Load:
    """``callers`` gRPC callers to ``127.0.0.1:grpc_port`` and as many REST callers to ``127.0.0.1:rest_port``."""

    def __init__(self, grpc_port: int, rest_port: int, callers: int, pause: float, max_requests: int,
                 max_seconds: float) -> None:
        self._grpc, self._rest = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}"
        self._pause, self._max_requests, self._max_seconds = pause, max_requests, max_seconds
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        self._busy: dict[int, bool] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i, transport), daemon=True, name=f"{transport}-{i}")
                         for i, transport in enumerate(["grpc", "rest"] * callers)]

    def start(self) -> None:
        """Start every caller."""
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop every caller after its current request (each waits at most its client's timeout)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def in_flight(self) -> int:
        """How many callers are inside a request now."""
        with self._lock:
            return sum(self._busy.values())

    def window(self, start: float, end: float) -> list[Outcome]:
        """The outcomes of the requests started in [start, end) (time.monotonic())."""
        with self._lock:
            return [o for o in self._outcomes if start <= o.start < end]

    def _run(self, index: int, transport: str) -> None:
        deadline = time.monotonic() + self._max_seconds
        client: Any = (grpcclient.InferenceServerClient(self._grpc) if transport == "grpc"
                       else httpclient.InferenceServerClient(self._rest, connection_timeout=30, network_timeout=30))
        call = _grpc_call if transport == "grpc" else _rest_call
        try:
            for _ in range(self._max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                with self._lock:
                    self._busy[index] = True
                start = time.monotonic()
                error: str | None = None
                try:
                    call(client)
                except Exception as failure:  # every failure is an outcome to report, whatever its type
                    error = f"{transport}: {type(failure).__name__}: {one_line(str(failure))}"
                outcome = Outcome(transport, start, time.monotonic() - start, error)
                with self._lock:
                    self._busy[index] = False
                    self._outcomes.append(outcome)
                self._stop.wait(self._pause)
        finally:
            client.close()
