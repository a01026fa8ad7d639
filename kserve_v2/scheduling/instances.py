"""A model version's instances (Triton's instance group): where its executions run.

Executions run on a thread pool sized by the version's instances (``backend.instance_groups``: Triton's
``count`` on each GPU of a KIND_GPU group), so ONNX Runtime never blocks the event loop for long
and at most ``count`` executions of a version run at once. An execution whose inputs are small
and whose version has been measured to take microseconds runs on the event loop itself: handing
it to a thread and back costs more than the work (two thread wake-ups and a loop wake-up per
request). The measure that decides is taken on the loop: on a thread the same work reads far
dearer while the loop holds the GIL (an ONNX Runtime run of 5 us reads about 100 us there), so
work measured on threads is tried on the loop now and then (``PROBE_EVERY``), unless even the
thread's reading is large. Cancelling a caller drops thread work that has not started and
tells running work to stop (``kserve_v2.backend.cancellation``: ONNX Runtime terminates between nodes).
An executable that is ``threaded`` (its executions may wait on other requests, as python models
do) always runs on its threads. With rate limiting on (``kserve_v2.scheduling.rate_limiter``) every
execution runs on a thread, once an instance and the resources its group lists are free.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Executable
from kserve_v2.backend.cancellation import Cancellation, running
from kserve_v2.backend.host import RateLimiting

log = logging.getLogger(__name__)

T = TypeVar("T")
# Work measured on the loop under this (running median of its CPU time, ns) with inputs under INLINE_BYTES runs there.
INLINE_NS = 100_000
INLINE_BYTES = 64 * 1024
# Work run on threads, whose running median there is under PROBE_NS, runs once on the loop after its
# first thread run and after every PROBE_EVERY-th, to be measured there.
PROBE_NS = 1_000_000
PROBE_EVERY = 64
_UNMEASURED = float("inf")


class InstancePool:
    """The instances of one loaded version: its executable and the threads that run it.

    Args:
        name, version: the version (thread names).
        count: instances (>= 1), executions that may run at once (``backend.instance_groups.instance_count``
            of the completed groups).
        executable: what the backend opened.
        groups: the completed instance groups, registered with ``limiter``.
        limiter: the server's rate limiter (``BackendHost.rate_limiter``); None: rate limiting is off,
            and a group's ``rate_limiter`` is ignored as Triton ignores it, with one warning naming it.

    Raises:
        RateLimitError: the groups' ``rate_limiter`` resources cannot be granted (the version's
            load failure reason, Triton's text).
    """

    def __init__(self, name: str, version: int, count: int, executable: Executable,
                 groups: Sequence[mc.ModelInstanceGroup] = (), limiter: RateLimiting | None = None) -> None:
        self._limited = limiter.register(groups) if limiter is not None and groups else None
        if limiter is None and any(group.HasField("rate_limiter") for group in groups):
            log.warning("model '%s' version %d: config field 'instance_group.rate_limiter' has no effect with "
                        "--rate-limit off (the default, as in Triton); start the server with --rate-limit "
                        "execution_count to honour it", name, version)
        self.count = count
        self.executable = executable
        self._running = 0  # executions in progress (inline or on a thread)
        self._cost_ns = _UNMEASURED  # running median of an execution's CPU time on the loop (never for threaded ones)
        self._thread_cost_ns = _UNMEASURED  # the same on instance threads, GIL hand-offs included
        self._thread_runs = 0
        self._probe = False  # the next execution runs on the loop to be measured there
        self._measured = not executable.threaded
        self._executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix=f"ort-{name}-{version}")

    def runs_inline(self, input_bytes: int) -> bool:
        """Whether an execution with ``input_bytes`` of inputs would run on the event loop now (see INLINE_NS)."""
        return (self._limited is None and (self._cost_ns < INLINE_NS or self._probe) and input_bytes <= INLINE_BYTES
                and self._running < self.count)

    async def run(self, work: Callable[[], T], input_bytes: int) -> tuple[T, int, int]:
        """Run ``work`` on an instance: (its result, started_ns, finished_ns).

        On the event loop when it is known to be cheap (``runs_inline``), else on an instance
        thread. Cancelling the caller drops thread work that has not started, and tells running
        work to stop (``kserve_v2.backend.cancellation``); work on the loop takes microseconds and runs to its end.
        """
        if self.runs_inline(input_bytes):
            return self.inline(work)
        limited = self._limited
        allocation = None if limited is None else await limited.acquire()
        cancellation = Cancellation()
        started = finished = 0

        def on_thread() -> T:
            nonlocal started, finished
            running(cancellation)
            try:
                result, started, finished = self._timed(work, on_loop=False)
                return result
            finally:
                running(None)

        loop = asyncio.get_running_loop()

        def finish() -> None:  # on the loop: the instance (and its rate limiter resources) is free again
            self._running -= 1
            if allocation is not None:
                allocation.release()

        def done(_: object) -> None:  # on the thread: the work finished, or was dropped unstarted
            if not loop.is_closed():
                loop.call_soon_threadsafe(finish)

        self._running += 1
        try:
            submitted = self._executor.submit(on_thread)
        except BaseException:
            finish()
            raise
        try:
            result = await asyncio.wrap_future(submitted)
        except asyncio.CancelledError:
            cancellation.cancel()
            submitted.add_done_callback(done)  # counted until the thread is free again
            raise
        except BaseException:
            finish()
            raise
        finish()
        return result, started, finished

    def inline(self, work: Callable[[], T]) -> tuple[T, int, int]:
        """Run ``work`` on the event loop, counted as a running execution: (result, started_ns, finished_ns)."""
        self._running += 1
        try:
            return self._timed(work, on_loop=True)
        finally:
            self._running -= 1

    def _timed(self, work: Callable[[], T], on_loop: bool) -> tuple[T, int, int]:
        """(``work()``, started_ns, finished_ns), its thread CPU time folded into the version's cost on
        the loop (what the loop would be blocked for, without other threads' preemption) or on threads."""
        started, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            result = work()
        finally:
            if self._measured:
                self._measure(time.thread_time_ns() - cpu, on_loop)
        return result, started, time.perf_counter_ns()

    def _measure(self, cpu_ns: int, on_loop: bool) -> None:
        if on_loop:
            cost, probe, self._probe = self._cost_ns, self._probe, False
            # a probe's reading replaces the estimate that sent the work to threads
            self._cost_ns = cpu_ns if probe else _follow_median(cost, cpu_ns)
            return
        self._thread_cost_ns = cost = _follow_median(self._thread_cost_ns, cpu_ns)
        self._thread_runs += 1
        if self._thread_runs % PROBE_EVERY == 1 and cost < PROBE_NS:
            self._probe = True

    def on_each(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` once on each instance thread, all at once, and wait for every run (blocking, off
        the event loop, while no request can reach the version: its warmup, ``kserve_v2.models.warmup``).
        A backend whose instances each take one execution at a time (the ``python`` backend's free
        instance queue) runs one on each instance. Each run's CPU time is measured as an execution's.

        Returns:
            each run's result, in submission order.

        Raises:
            The first run's exception, once every run has ended.
        """
        together = threading.Barrier(self.count)  # no thread takes a second run: each instance thread runs one

        def run() -> T:
            together.wait()
            return self._timed(work, on_loop=False)[0]

        futures = [self._executor.submit(run) for _ in range(self.count)]
        wait(futures)
        return [future.result() for future in futures]

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking)."""
        self._executor.shutdown(wait=True)
        if self._limited is not None:
            self._limited.close()
        self.executable.close()
        del self.executable


def _follow_median(estimate: float, reading: int) -> float:
    """A running median (ns): the first reading, then a tenth up or down towards each reading, so the
    readings' long tail (preemption, a garbage collection, GIL hand-offs) does not pull it up."""
    if estimate == _UNMEASURED:
        return reading
    return estimate * 1.1 if reading > estimate else estimate / 1.1


def nbytes(feeds: dict[str, np.ndarray]) -> int:
    """The bytes of a request's input arrays."""
    total = 0
    for array in feeds.values():
        total += array.nbytes
    return total
