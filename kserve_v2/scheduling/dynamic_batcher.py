"""Triton's dynamic batcher for one model version (``model_configuration.md``, dynamic batcher).

Requests queue per version; a batch is formed when a model instance is free: the longest run of
compatible requests at the head of the queue (same batch key: by default the inputs' non-batch
shapes and datatypes, the outputs and the parameters) whose sizes sum to at most the batch limit. It is dispatched at once
when a prefix of it reaches a ``preferred_batch_size`` (the largest such prefix), when it is full
or cannot grow, or when its oldest request has waited ``max_queue_delay_microseconds``.
The executor merges the members and splits the results (tensor models: along the batch dim,
``RowBatching``; text models: texts into one tokenized batch, as the backend's ``BatchStrategy``
says). A failing batch fails each member with the error; the batcher keeps running. A request
the batcher would dispatch alone at once (an instance free, nothing queued, no queue delay) whose
execution is measured to be tiny runs on the event loop here and now, unmerged (the fast path of
``InstancePool.runs_inline``). ``default_queue_policy``:
``max_queue_size`` bounds the queue (more gets UNAVAILABLE "Exceeds maximum queue size"), and
``default_timeout_microseconds`` with ``timeout_action: REJECT`` rejects requests that waited
longer (UNAVAILABLE "Request timeout expired"). A cancelled request leaves the queue at once, and
a running batch whose members are all gone is cancelled, which stops the model's execution
(``kserve_v2.backend.cancellation``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, BatchStrategy, Executable, Execution, Parameter, RequestContext
from kserve_v2.protocol.errors import InternalError, Overloaded, Unavailable
from kserve_v2.scheduling.base import Execute, Feeds, Key, Outcome, Pending, fail_pending, model_time
from kserve_v2.scheduling.instances import InstancePool, nbytes

# (feeds, V2 batch size) -> the request's size in the batch limit
Items = Callable[[Feeds, int], int]


class DynamicBatcher:
    """Merges the requests of one model version into batches (see the module docstring); a ``Scheduler``.

    Args:
        config: the version's ``dynamic_batching`` settings.
        max_batch_size: the most rows (or texts) in one batch (> 0).
        instances: batches that may run at once (the instance group count).
        execute: merges, runs and splits one batch on a model instance (``batch_executor``).
        key: the batch key (default ``row_key``).
        items: a request's size in the batch limit (default: its batch size).
        pool: the version's instances, released by ``close``; None for a batcher that owns none.
        alone: whether a request dispatched alone at once may execute unmerged on ``pool``'s event
            loop fast path (tensor batching; not a strategy that must merge, as text batching).
    """

    def __init__(self, config: mc.ModelDynamicBatching, max_batch_size: int, instances: int, execute: Execute,
                 key: Key | None = None, *, items: Items | None = None, pool: InstancePool | None = None,
                 alone: bool = False) -> None:
        self._key = key or row_key
        self._items = items
        self._pool = pool
        self._fast = pool if alone else None
        self._waiting = False  # the loop holds a free instance and waits for a request
        self._max_batch = max_batch_size
        self._preferred = sorted({s for s in config.preferred_batch_size if 0 < s <= max_batch_size})
        self._delay_ns = config.max_queue_delay_microseconds * 1000
        policy = config.default_queue_policy
        self._max_queue = policy.max_queue_size
        reject = policy.timeout_action == mc.ModelQueuePolicy.REJECT
        self._timeout_ns = policy.default_timeout_microseconds * 1000 if reject else 0
        self._execute = execute
        self._slots = asyncio.Semaphore(instances)
        self._queue: deque[Pending] = deque()
        self._arrived = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                     batch_size: int, context: RequestContext = NO_CONTEXT) -> Outcome:
        """Queue one request and wait for its share of a batch: (execution, queue_ns, infer_ns), as
        ``Scheduler.submit``; or run it here and now (the fast path, see the module docstring).

        Raises:
            Overloaded: the queue holds ``max_queue_size`` requests -> UNAVAILABLE / 503.
            Unavailable: it waited longer than the queue policy's timeout -> UNAVAILABLE / 503.
            Whatever the batch's execution raised.
        """
        fast = self._fast
        if fast is not None and self.forms_batch_of_one() and fast.runs_inline(nbytes(feeds)):
            executable = fast.executable
            execution, started, finished = fast.inline(lambda: executable.execute(feeds, output_names, parameters,
                                                                                  context))
            return execution, 0, model_time(execution, started, finished)
        if self._max_queue and len(self._queue) >= self._max_queue:
            raise Overloaded("Exceeds maximum queue size")
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        if self._items is not None:
            batch_size = self._items(feeds, batch_size)
        request = Pending(feeds, output_names, parameters, self._key(feeds, output_names, parameters),
                          time.perf_counter_ns(), asyncio.get_running_loop().create_future(), batch_size,
                          context=context)
        self._queue.append(request)
        self._arrived.set()
        expiry = (asyncio.get_running_loop().call_later(self._timeout_ns / 1e9, self._expire, request)
                  if self._timeout_ns else None)
        try:
            return await request.future
        except asyncio.CancelledError:  # the caller went away or its deadline passed: leave the queue now
            self._leave(request)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _leave(self, request: Pending) -> None:
        try:
            self._queue.remove(request)
        except ValueError:
            pass  # already taken into a batch (whose execution stops when all its members are gone)

    def _expire(self, request: Pending) -> None:
        """Reject a request still queued when the queue policy's timeout passes."""
        if not request.future.done() and request in self._queue:
            self._leave(request)
            request.future.set_exception(Unavailable("Request timeout expired"))

    def forms_batch_of_one(self) -> bool:
        """Whether a request arriving now would be dispatched alone at once: the loop holds a free
        instance, the queue is empty and there is no queue delay to wait for others."""
        return self._waiting and not self._delay_ns and not self._queue

    def stop(self) -> None:
        """Stop forming batches (the version is retired; its queue is empty)."""
        if self._loop_task is not None:
            self._loop_task.cancel()

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking; see ``Scheduler.close``)."""
        if self._pool is not None:
            self._pool.close()

    async def _loop(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[Pending]:
        while True:
            self._drop_finished()
            if not self._queue:
                self._arrived.clear()
                self._waiting = True
                try:
                    await self._arrived.wait()
                finally:
                    self._waiting = False
                continue
            head = self._queue[0]
            taken, total = 0, 0
            for request in self._queue:
                if request.key != head.key or total + request.batch_size > self._max_batch:
                    break
                taken, total = taken + 1, total + request.batch_size
            taken = max(taken, 1)  # a request alone always runs (its size was checked against the model)
            sizes = list(itertools.accumulate(r.batch_size for r in itertools.islice(self._queue, taken)))
            preferred = [i + 1 for i, size in enumerate(sizes) if size in self._preferred]
            can_grow = taken == len(self._queue) and total < self._max_batch
            waited = time.perf_counter_ns() - head.enqueued_ns
            if preferred or not can_grow or waited >= self._delay_ns:
                count = preferred[-1] if preferred else taken
                return [self._queue.popleft() for _ in range(count)]
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), (self._delay_ns - waited) / 1e9)
            except TimeoutError:
                pass

    def _drop_finished(self) -> None:
        """Forget cancelled requests and reject those past the queue policy's timeout."""
        now = time.perf_counter_ns()
        kept: deque[Pending] = deque()
        for request in self._queue:
            if request.future.done():
                continue
            if self._timeout_ns and now - request.enqueued_ns > self._timeout_ns:
                request.future.set_exception(Unavailable("Request timeout expired"))
                continue
            kept.append(request)
        self._queue = kept

    async def _run(self, batch: list[Pending]) -> None:
        try:
            live = [r for r in batch if not r.future.done()]
            if not live:
                return
            execution = asyncio.ensure_future(self._execute([r.feeds for r in live], live[0].output_names,
                                                            live[0].parameters, [r.context for r in live]))

            def member_done(_: asyncio.Future[Outcome]) -> None:
                if all(r.future.done() for r in live):
                    execution.cancel()  # no one waits for it: stop the model (kserve_v2.backend.cancellation)

            for request in live:
                request.future.add_done_callback(member_done)
            try:
                shares, started, finished = await execution
            except asyncio.CancelledError:
                if all(r.future.done() for r in live):
                    return  # stopped because no member waits any more
                fail_pending(live)
                raise
            except BaseException as err:  # noqa: BLE001 - every member gets the batch's error
                fail_pending(live, err if isinstance(err, Exception) else None)
                if not isinstance(err, Exception):
                    raise
                return
            for request, share in zip(live, shares, strict=True):
                if request.future.done():
                    continue
                if isinstance(share, Exception):
                    request.future.set_exception(share)
                else:
                    request.future.set_result((share, started - request.enqueued_ns, model_time(share, started, finished)))
        finally:
            self._slots.release()


def row_key(feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter]) -> Hashable:
    """Tensor models batch requests with the same outputs, parameters and non-batch input shapes."""
    return (tuple(output_names), tuple(sorted((k, str(v)) for k, v in parameters.items())),
            tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(feeds.items())))


def merge_rows(members: list[Feeds]) -> Feeds:
    """The members' inputs concatenated along the batch dim."""
    if len(members) == 1:
        return members[0]
    return {name: np.concatenate([m[name] for m in members]) for name in members[0]}


def split_rows(execution: Execution, sizes: list[int]) -> list[Execution]:
    """A batch's execution cut along the batch dim into the members' shares (the first counts
    the execution and the tokens).

    Raises:
        InternalError: an output without the batch's rows.
    """
    if len(sizes) == 1:
        return [execution]
    total, bounds = sum(sizes), list(itertools.accumulate(sizes))[:-1]
    for array in execution.outputs:
        if array.ndim == 0 or array.shape[0] != total:
            raise InternalError(f"the model returned an output of shape {list(array.shape)} for a batch of {total}")
    per_output = [np.split(array, bounds) for array in execution.outputs]
    return [Execution(list(parts), execution.pre_ns, execution.post_ns, execution.tokens if i == 0 else 0, int(i == 0))
            for i, parts in enumerate(zip(*per_output, strict=True))]


def batch_executor(pool: InstancePool, strategy: BatchStrategy) -> Execute:
    """The ``Execute`` of a model's batchers: the members merged, run and split as ``strategy``
    says, on one of ``pool``'s instances; each share counts the execution's whole size (its
    statistics' ``batch_stats`` row)."""

    async def execute(members: list[Feeds], output_names: Sequence[str], parameters: Mapping[str, Parameter],
                      contexts: Sequence[RequestContext]) -> tuple[list[Execution | Exception], int, int]:
        def merged() -> list[Execution | Exception]:
            shares = strategy.execute_batch(members, output_names, parameters, contexts)
            size = sum(strategy.items(m, len(next(iter(m.values())))) for m in members)
            for share in shares:  # statistics count the execution by its real batch size
                if isinstance(share, Execution):
                    share.batch_size = size
            return shares

        return await pool.run(merged, sum(map(nbytes, members)))

    return execute


class RowBatching:
    """Tensor batching: the requests' rows concatenated along dim 0, executed once, split back
    (``max_batch_size > 0``; Triton's dynamic batcher). The strategy of every backend that names none."""

    inline = True

    def __init__(self, executable: Executable) -> None:
        self._executable = executable

    def limit(self, config: mc.ModelConfig) -> int:
        """``max_batch_size`` rows (0: no batching)."""
        return config.max_batch_size

    def items(self, feeds: Feeds, batch_size: int) -> int:
        """The request's rows."""
        return batch_size

    def key(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter]) -> Hashable:
        """Same outputs, parameters and non-batch input shapes (``row_key``)."""
        return row_key(feeds, output_names, parameters)

    def execute_batch(self, members: list[Feeds], output_names: Sequence[str], parameters: Mapping[str, Parameter],
                      contexts: Sequence[RequestContext] = ()) -> list[Execution | Exception]:
        """Merge the rows, execute once, and give each member its own rows back (tensor models take
        no request context)."""
        sizes = [len(next(iter(m.values()))) for m in members]
        return list(split_rows(self._executable.execute(merge_rows(members), output_names, parameters), sizes))
