"""A loaded, servable model version: its configuration, backend executable, executor and statistics.

Executions run on a thread pool sized by the instance group count, so ORT never blocks the
event loop for long and at most ``count`` executions of a version run at once. An execution whose
inputs are small and whose version has been measured to take microseconds runs on the event loop
itself: handing it to a thread and back costs more than the work (two thread wake-ups and a loop
wake-up per request). With ``dynamic_batching`` requests go through the version's
``DynamicBatcher`` first, merged as the backend's ``BatchStrategy`` says (rows along dim 0 with
``max_batch_size > 0``, or a text backend's texts); with ``sequence_batching``, through its
``SequenceBatcher``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import BatchStrategy, Executable, Execution, Parameter
from kserve_v2.batching import DynamicBatcher, merge_rows, row_key, split_rows
from kserve_v2.cancellation import Cancellation, running
from kserve_v2.sequence import SequenceBatcher
from kserve_v2.sequence_config import SequenceSettings
from kserve_v2.spec import ModelSpec
from kserve_v2.statistics import ModelStats
from kserve_v2.text import TextContract

T = TypeVar("T")
# Work measured under this (moving average of its thread CPU time, ns) with inputs under INLINE_BYTES runs on the loop.
INLINE_NS = 100_000
INLINE_BYTES = 64 * 1024
_UNMEASURED = float("inf")


class ModelVersion:
    """One READY version of a model.

    Attributes:
        name, version: identity (version > 0); label: the version as text (metric labels, responses).
        config: the completed ModelConfig served by the ModelConfig RPC.
        spec: tensor interface used for validation and metadata.
        stats: Triton-style counters.
        inflight: requests currently using this version (unload drains them).
    """

    def __init__(self, name: str, version: int, config: mc.ModelConfig, executable: Executable,
                 sequence: SequenceSettings | None = None, labels: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.name = name
        self.version = version
        self.label = str(version)
        self.config = config
        self.spec = ModelSpec.from_config(config, labels)
        self.stats = ModelStats()
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._executable = executable
        self.on_gpu = executable.on_cuda
        instances = sum(g.count for g in config.instance_group) or 1
        self._instances = instances
        self._running = 0  # executions in progress (inline or on a thread)
        self._cost_ns = _UNMEASURED  # moving average of an execution's duration
        self._executor = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"ort-{name}-{version}")
        self._batcher: DynamicBatcher | SequenceBatcher | None = None
        self._batching: BatchStrategy = executable.batching or RowBatching(executable)
        limit = self._batching.limit(config) if config.HasField("dynamic_batching") else 0
        if limit > 0:
            self._batcher = DynamicBatcher(config.dynamic_batching, limit, instances, self._execute_batch,
                                           self._batching.key)
        if sequence is not None:
            self._batcher = SequenceBatcher(sequence, instances, self._execute_batch)

    async def run(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                  parameters: Mapping[str, Parameter], batch_size: int) -> tuple[Execution, int, int]:
        """Execute off the event loop, through the dynamic batcher when the version has one; work
        measured to be tiny (see ``runs_inline``) runs on the loop, and when the dynamic batcher
        would dispatch the request alone at once (idle, no queue delay) it executes here and now.

        Args:
            feeds: input name -> array in the model's shape.
            output_names: outputs to return, in order.
            parameters: the request's parameters, for backends that take options.
            batch_size: the request's batch size (its share of a merged batch).

        Returns:
            (execution, queue_ns, infer_ns): queue_ns is the wait for a batch and a free
            instance; infer_ns is the model's own time (the execution's pre and post time taken out).

        Raises:
            Overloaded / Unavailable: the batcher's queue is full, or its timeout expired.
        """
        batcher = self._batcher
        alone = batcher is None or (self._batching.inline and isinstance(batcher, DynamicBatcher)
                                    and batcher.forms_batch_of_one())
        if alone and self.runs_inline(_nbytes(feeds)):  # the batch of one the batcher would form, run here and now
            execution, started, finished = self._inline(lambda: self._executable.execute(feeds, output_names, parameters))
            return execution, 0, finished - started - execution.pre_ns - execution.post_ns
        if batcher is not None:
            batch_size = self._batching.items(feeds, batch_size)
            execution, queue_ns, run_ns = await batcher.submit(feeds, output_names, parameters, batch_size)
        else:
            submitted = time.perf_counter_ns()
            execution, started, finished = await self._execute(feeds, output_names, parameters)
            queue_ns, run_ns = started - submitted, finished - started
        return execution, queue_ns, run_ns - execution.pre_ns - execution.post_ns

    async def _execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                             parameters: Mapping[str, Parameter]) -> tuple[list[Execution | Exception], int, int]:
        """One merged batch on an instance thread, merged as the backend's ``BatchStrategy`` says."""

        def execute() -> list[Execution | Exception]:
            shares = self._batching.execute_batch(members, output_names, parameters)
            size = sum(self._batching.items(m, len(next(iter(m.values())))) for m in members)
            for share in shares:  # statistics count the execution by its real batch size
                if isinstance(share, Execution):
                    share.batch_size = size
            return shares

        return await self._on_instance(execute, sum(map(_nbytes, members)))

    @property
    def text(self) -> TextContract | None:
        """The text contract of its backend (``kserve_v2.text``); None for a tensor model."""
        return self._executable.text

    async def _execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                       parameters: Mapping[str, Parameter]) -> tuple[Execution, int, int]:
        """One execution on an instance thread: (execution, started_ns, finished_ns)."""
        return await self._on_instance(lambda: self._executable.execute(feeds, output_names, parameters),
                                       _nbytes(feeds))

    async def _on_instance(self, work: Callable[[], T], input_bytes: int) -> tuple[T, int, int]:
        """Run ``work`` on an instance: (its result, started_ns, finished_ns).

        On the event loop when it is known to be cheap (see INLINE_NS) and an instance is free,
        else on an instance thread. Cancelling the caller drops thread work that has not started,
        and tells running work to stop (``kserve_v2.cancellation``: ONNX Runtime terminates
        between nodes); work on the loop takes microseconds and runs to its end.
        """
        if self.runs_inline(input_bytes):
            return self._inline(work)
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

    def _inline(self, work: Callable[[], T]) -> tuple[T, int, int]:
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
            cpu = time.thread_time_ns() - cpu
            cost = self._cost_ns
            self._cost_ns = cpu if cost == _UNMEASURED else 0.8 * cost + 0.2 * cpu
        return result, started, time.perf_counter_ns()

    def _done(self) -> None:
        self._running -= 1

    def runs_inline(self, input_bytes: int) -> bool:
        """Whether an execution with ``input_bytes`` of inputs would run on the event loop now (see INLINE_NS)."""
        return self._cost_ns < INLINE_NS and input_bytes <= INLINE_BYTES and self._running < self._instances

    def hold(self) -> None:
        """A request starts using this version (event loop only)."""
        self.inflight += 1
        self._idle.clear()

    def release(self) -> None:
        """A request is done with this version (event loop only)."""
        self.inflight -= 1
        if not self.inflight:
            self._idle.set()

    async def drained(self) -> None:
        """Wait until no request uses this version, then stop its batcher (event loop only)."""
        await self._idle.wait()
        if self._batcher is not None:
            self._batcher.stop()

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking)."""
        self._executor.shutdown(wait=True)
        del self._executable


def _nbytes(feeds: dict[str, np.ndarray]) -> int:
    """The bytes of a request's input arrays."""
    total = 0
    for array in feeds.values():
        total += array.nbytes
    return total


class RowBatching:
    """Tensor batching: the requests' rows concatenated along dim 0, executed once, split back
    (``max_batch_size > 0``; Triton's dynamic batcher). The strategy of every backend that names none."""

    inline = True

    def __init__(self, executable: Executable) -> None:
        self._executable = executable

    def limit(self, config: mc.ModelConfig) -> int:
        """``max_batch_size`` rows (0: no batching)."""
        return config.max_batch_size

    def items(self, feeds: dict[str, np.ndarray], batch_size: int) -> int:
        """The request's rows."""
        return batch_size

    def key(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
            parameters: Mapping[str, Parameter]) -> Hashable:
        """Same outputs, parameters and non-batch input shapes (``batching.row_key``)."""
        return row_key(feeds, output_names, parameters)

    def execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                      parameters: Mapping[str, Parameter]) -> list[Execution | Exception]:
        """Merge the rows, execute once, and give each member its own rows back."""
        sizes = [len(next(iter(m.values()))) for m in members]
        return list(split_rows(self._executable.execute(merge_rows(members), output_names, parameters), sizes))
