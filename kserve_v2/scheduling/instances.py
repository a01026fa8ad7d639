"""A model version's instances (Triton's instance group): where its executions run.

Executions run on a thread pool sized by the instance group count, so ONNX Runtime never blocks
the event loop for long and at most ``count`` executions of a version run at once. An execution
whose inputs are small and whose version has been measured to take microseconds runs on the
event loop itself: handing it to a thread and back costs more than the work (two thread wake-ups
and a loop wake-up per request). Cancelling a caller drops thread work that has not started and
tells running work to stop (``kserve_v2.backend.cancellation``: ONNX Runtime terminates between nodes).
An executable that is ``threaded`` (its executions may wait on other requests, as python models
do) always runs on its threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from kserve_v2.backend import Executable
from kserve_v2.backend.cancellation import Cancellation, running

T = TypeVar("T")
# Work measured under this (moving average of its thread CPU time, ns) with inputs under INLINE_BYTES runs on the loop.
INLINE_NS = 100_000
INLINE_BYTES = 64 * 1024
_UNMEASURED = float("inf")


class InstancePool:
    """The instances of one loaded version: its executable and the threads that run it.

    Args:
        name, version: the version (thread names).
        count: instances, the instance group count (>= 1): executions that may run at once.
        executable: what the backend opened.
    """

    def __init__(self, name: str, version: int, count: int, executable: Executable) -> None:
        self.count = count
        self.executable = executable
        self._running = 0  # executions in progress (inline or on a thread)
        self._cost_ns = _UNMEASURED  # moving average of an execution's thread CPU time (never for threaded ones)
        self._measured = not executable.threaded
        self._executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix=f"ort-{name}-{version}")

    def runs_inline(self, input_bytes: int) -> bool:
        """Whether an execution with ``input_bytes`` of inputs would run on the event loop now (see INLINE_NS)."""
        return self._cost_ns < INLINE_NS and input_bytes <= INLINE_BYTES and self._running < self.count

    async def run(self, work: Callable[[], T], input_bytes: int) -> tuple[T, int, int]:
        """Run ``work`` on an instance: (its result, started_ns, finished_ns).

        On the event loop when it is known to be cheap (``runs_inline``), else on an instance
        thread. Cancelling the caller drops thread work that has not started, and tells running
        work to stop (``kserve_v2.backend.cancellation``); work on the loop takes microseconds and runs to its end.
        """
        if self.runs_inline(input_bytes):
            return self.inline(work)
        cancellation = Cancellation()
        started = finished = 0

        def on_thread() -> T:
            nonlocal started, finished
            running(cancellation)
            try:
                result, started, finished = self._timed(work)
                return result
            finally:
                running(None)

        loop = asyncio.get_running_loop()

        def done(_: object) -> None:  # on the thread: the work finished, or was dropped unstarted
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._done)

        submitted = self._executor.submit(on_thread)
        self._running += 1
        try:
            result = await asyncio.wrap_future(submitted)
        except asyncio.CancelledError:
            cancellation.cancel()
            submitted.add_done_callback(done)  # counted until the thread is free again
            raise
        except BaseException:
            self._running -= 1
            raise
        self._running -= 1
        return result, started, finished

    def inline(self, work: Callable[[], T]) -> tuple[T, int, int]:
        """Run ``work`` on the event loop, counted as a running execution: (result, started_ns, finished_ns)."""
        self._running += 1
        try:
            return self._timed(work)
        finally:
            self._running -= 1

    def _timed(self, work: Callable[[], T]) -> tuple[T, int, int]:
        """(``work()``, started_ns, finished_ns), its thread CPU time folded into the version's cost
        (what the loop would be blocked for, without other threads' preemption)."""
        started, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            result = work()
        finally:
            if self._measured:
                cpu = time.thread_time_ns() - cpu
                cost = self._cost_ns
                self._cost_ns = cpu if cost == _UNMEASURED else 0.8 * cost + 0.2 * cpu
        return result, started, time.perf_counter_ns()

    def _done(self) -> None:
        self._running -= 1

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking)."""
        self._executor.shutdown(wait=True)
        self.executable.close()
        del self.executable


def nbytes(feeds: dict[str, np.ndarray]) -> int:
    """The bytes of a request's input arrays."""
    total = 0
    for array in feeds.values():
        total += array.nbytes
    return total
