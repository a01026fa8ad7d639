"""Triton's dynamic batcher for one model version (``model_configuration.md``, dynamic batcher).

Requests wait in a ``PriorityQueue`` (``kserve_v2.scheduling.priority_queue``: priority levels,
queue policies, timeouts); a batch is formed when a model instance is free: the longest run of
compatible requests at the head of the queue (same batch key: by default the inputs' non-batch
shapes and datatypes, the outputs and the parameters other than Triton's reserved ones) whose sizes
sum to at most the batch limit. It is dispatched at once when a prefix of it reaches a
``preferred_batch_size`` (the largest such prefix), when it is full or cannot grow, or when its
oldest request has waited ``max_queue_delay_microseconds``. The executor merges the members and
splits the results (tensor models: along the batch dim, ``RowBatching``; text models: texts into
one tokenized batch; ragged models: ragged inputs concatenated, batch inputs built and batch outputs
scattered, ``kserve_v2.scheduling.ragged``; as the backend's ``BatchStrategy`` says). A failing
batch fails each member with the error; the batcher keeps running. A request the batcher would
dispatch alone at once (an instance free, nothing queued, no queue delay) whose execution is
measured to be tiny runs on the event loop here and now, unmerged (``base.run_inline``, the fast
path ``DirectScheduler`` takes too); any other such request (without ``preserve_ordering``) is
dispatched as a batch of one from the caller's own task, sparing the queue and the wake-ups of the
batcher's task: the batcher's task waits for queued requests first and only then for an instance,
so an idle batcher holds no instance. A cancelled request leaves the queue at once, and a running
batch whose members are all gone is cancelled, which stops the model's execution
(``kserve_v2.backend.cancellation``).

``preserve_ordering``: answers leave in the order the requests were dispatched (their arrival
order, as the configuration allows one level and no DELAY then), even when a later batch on another
instance finishes first (Triton's completion queue).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, BatchStrategy, Executable, Execution, Parameter, RequestContext
from kserve_v2.scheduling.batch_rows import merge_rows, row_key, split_rows
from kserve_v2.scheduling.base import (DynamicRequest, Execute, Feeds, Key, Outcome, fail_pending, model_time,
                                       run_inline)
from kserve_v2.scheduling.instances import InstancePool, nbytes
from kserve_v2.scheduling.priority_queue import Clock, PriorityQueue, request_priority, request_timeout_us

# (feeds, V2 batch size) -> the request's size in the batch limit
Items = Callable[[Feeds, int], int]


def queue_policy_problem(config: mc.ModelConfig) -> str | None:
    """What Triton's core refuses to load in a ``dynamic_batching`` block's priorities and queue
    policies (``model_config_utils.cc``), in its words; None when they are fine. The caller fails
    the load with it (INVALID_ARG in Triton)."""
    if not config.HasField("dynamic_batching"):
        return None
    batching = config.dynamic_batching
    levels = batching.priority_levels
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            return f"default priority level must be in range [1, {levels}] for {config.name}"
        if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
            return f"priority queue policy must have priority level in range [1, {levels}] for {config.name}"
    if batching.preserve_ordering:
        if levels > 1:
            return f"Only one priority level is allowed when 'preserve_ordering' is true for {config.name}"
        for policy in [batching.default_queue_policy, *batching.priority_queue_policy.values()]:
            if policy.default_timeout_microseconds and policy.timeout_action == mc.ModelQueuePolicy.DELAY:
                return (f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for "
                        f"{config.name}")
    return None


class DynamicBatcher:
    """Merges the requests of one model version into batches (see the module docstring); a ``Scheduler``.

    Args:
        config: the version's ``dynamic_batching`` settings (checked by ``queue_policy_problem``).
        max_batch_size: the most rows (or texts) in one batch (> 0).
        instances: batches that may run at once (the instance group count).
        execute: merges, runs and splits one batch on a model instance (``batch_executor``).
        key: the batch key (default ``row_key``).
        items: a request's size in the batch limit (default: its batch size).
        pool: the version's instances, released by ``close``; None for a batcher that owns none.
        alone: whether a request dispatched alone at once may execute unmerged on ``pool``'s event
            loop fast path (tensor batching; not a strategy that must merge, as text batching).
        clock: the queue's time, ns (``time.perf_counter_ns``, as ``execute``'s started_ns; see
            ``PriorityQueue``).
    """

    def __init__(self, config: mc.ModelDynamicBatching, max_batch_size: int, instances: int, execute: Execute,
                 key: Key | None = None, *, items: Items | None = None, pool: InstancePool | None = None,
                 alone: bool = False, clock: Clock = time.perf_counter_ns) -> None:
        self._key = key or row_key
        self._items = items
        self._pool = pool
        self._fast = pool if alone else None
        self._max_batch = max_batch_size
        self._preferred = sorted({s for s in config.preferred_batch_size if 0 < s <= max_batch_size})
        self._delay_ns = config.max_queue_delay_microseconds * 1000
        self._queue = PriorityQueue(config, clock)
        self._preserve = config.preserve_ordering
        self._dispatched: deque[DynamicRequest] = deque()  # preserve_ordering: dispatched, answer not yet released
        self._execute = execute
        self._slots = asyncio.Semaphore(instances)
        self._arrived = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                     batch_size: int, context: RequestContext = NO_CONTEXT) -> Outcome:
        """Queue one request at its priority level and wait for its share of a batch: (execution,
        queue_ns, infer_ns), as ``Scheduler.submit``; or run it here and now (the fast path, see the
        module docstring).

        Raises:
            InvalidInput: a bad ``priority`` or ``timeout`` parameter -> INVALID_ARGUMENT / 400.
            Overloaded: its level's queue holds ``max_queue_size`` requests -> UNAVAILABLE / 503.
            Unavailable: it waited longer than its timeout under ``REJECT`` -> UNAVAILABLE / 503.
            Whatever the batch's execution raised.
        """
        submitted = time.perf_counter_ns()
        priority = request_priority(parameters)
        timeout_us = request_timeout_us(parameters)
        fast = self._fast
        if (fast is not None and self.forms_batch_of_one() and not self._dispatched and (outcome := run_inline(
                fast, nbytes(feeds), feeds, output_names, parameters, context, submitted)) is not None):
            return outcome
        if self._items is not None:
            batch_size = self._items(feeds, batch_size)
        if self.forms_batch_of_one() and not self._preserve and not self._slots.locked():
            return await self._dispatch_now(feeds, output_names, parameters, context, submitted)
        loop, queue = asyncio.get_running_loop(), self._queue
        request = DynamicRequest(feeds, output_names, parameters, self._key(feeds, output_names, parameters),
                                 queue.clock(), loop.create_future(), context, batch_size)
        queue.enqueue(request, priority, timeout_us)
        if self._loop_task is None:
            self._loop_task = loop.create_task(self._loop())
        self._arrived.set()
        try:
            outcome = await request.future
        except asyncio.CancelledError:  # the caller went away or its deadline passed: leave the queue now
            queue.remove(request)
            raise
        except Exception:
            if request.released is not None:
                await request.released
            raise
        if request.released is not None:  # preserve_ordering: after every request dispatched before it
            await request.released
        return outcome

    async def _dispatch_now(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                            context: RequestContext, submitted_ns: int) -> Outcome:
        """A batch of one dispatched in the caller's task: an instance is free and nothing is queued,
        so the batcher would dispatch it alone at once; this spares the queue and the batcher's task
        wake-ups. Cancelling the caller stops the execution, as for a batch whose members are all gone."""
        await self._slots.acquire()  # free (``locked`` was false): returns without waiting
        try:
            shares, started, finished = await self._execute([feeds], output_names, parameters, [context])
        finally:
            self._slots.release()
        (share,) = shares
        if isinstance(share, Exception):
            raise share
        return share, started - submitted_ns, model_time(share, started, finished)

    def forms_batch_of_one(self) -> bool:
        """Whether a request arriving now would be dispatched alone at once, given a free instance
        (which ``InstancePool.runs_inline`` checks): the queue is empty and there is no queue delay
        to wait for others."""
        return not self._delay_ns and not self._queue

    def stop(self) -> None:
        """Stop forming batches (the version is retired; its queue is empty)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._queue.close()

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking; see ``Scheduler.close``)."""
        if self._pool is not None:
            self._pool.close()

    async def _loop(self) -> None:
        while True:
            await self._requests_queued()  # then an instance: an idle batcher holds none (``_dispatch_now``)
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            if self._preserve:
                self._hold_answers(batch)
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _hold_answers(self, batch: list[DynamicRequest]) -> None:
        """``preserve_ordering``: each member's answer waits for those dispatched before it (Triton's
        completion queue)."""
        loop = asyncio.get_running_loop()
        for request in batch:
            request.released = loop.create_future()
            self._dispatched.append(request)
            request.future.add_done_callback(self._release_answers)

    def _release_answers(self, _: object = None) -> None:
        dispatched = self._dispatched
        while dispatched and dispatched[0].future.done():
            released = dispatched.popleft().released
            if released is not None and not released.done():
                released.set_result(None)

    async def _requests_queued(self) -> None:
        """Return once the queue holds a request, its timeouts applied (REJECT and DELAY)."""
        queue = self._queue
        while True:
            queue.apply_policies()
            if queue:
                return
            self._arrived.clear()
            await self._arrived.wait()

    async def _next_batch(self) -> list[DynamicRequest]:
        queue = self._queue
        while True:
            await self._requests_queued()  # again: the queue may have emptied while an instance was awaited
            best, can_grow = self._pending_batch()
            now = queue.clock()
            waited = now - queue.oldest_enqueued_ns
            if best or not can_grow or waited >= self._delay_ns:
                return queue.dequeue(best or queue.pending_count)
            wait_ns = self._delay_ns - waited
            closest = queue.closest_timeout_ns
            if closest:  # a member's timeout may reorder (DELAY) or shrink (REJECT) the batch
                wait_ns = min(wait_ns, max(0, closest - now) + 1000)
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_ns / 1e9)
            except TimeoutError:
                pass

    def _pending_batch(self) -> tuple[int, bool]:
        """Grow the queue's pending batch from its head: the longest run of requests with the first
        one's key whose sizes fit in the batch limit. (the requests of its largest prefix that
        reaches a preferred batch size, 0: none; whether it may still grow)."""
        queue, limit = self._queue, self._max_batch
        queue.reset_cursor()
        key: Hashable = None
        total = best = 0
        while (request := queue.at_cursor()) is not None:
            if not queue.pending_count:
                key = request.key  # the first always joins (its size was checked against the model)
            elif request.key != key or total + request.batch_size > limit:
                return best, False
            queue.advance_cursor()
            total += request.batch_size
            if total in self._preferred:
                best = queue.pending_count
            if total >= limit:
                return best, False
        return best, True

    async def _run(self, batch: list[DynamicRequest]) -> None:
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
