"""Triton's dynamic batcher for one model version (``model_configuration.md``, dynamic batcher).

Requests queue per version; a batch is formed when a model instance is free: the longest run of
compatible requests at the head of the queue (same batch key: by default the inputs' non-batch
shapes and datatypes, the outputs and the parameters other than Triton's reserved ones) whose sizes
sum to at most the batch limit. It is dispatched at once
when a prefix of it reaches a ``preferred_batch_size`` (the largest such prefix), when it is full
or cannot grow, or when its oldest request has waited ``max_queue_delay_microseconds``.
The executor merges the members and splits the results (tensor models: along the batch dim,
``RowBatching``; text models: texts into one tokenized batch; ragged models: ragged inputs
concatenated, batch inputs built and batch outputs scattered, ``kserve_v2.scheduling.ragged``; as
the backend's ``BatchStrategy`` says). A failing batch fails each member with the error; the batcher keeps running. A request
the batcher would dispatch alone at once (an instance free, nothing queued, no queue delay) whose
execution is measured to be tiny runs on the event loop here and now, unmerged (the fast path of
``InstancePool.runs_inline``). A cancelled request leaves the queue at once, and a running batch
whose members are all gone is cancelled, which stops the model's execution
(``kserve_v2.backend.cancellation``).

Priorities and queue policies, as Triton's core has them (``scheduler_utils.cc``, ``PriorityQueue``;
the schedule-policy extension):

- ``priority_levels`` levels, 1 the highest; the queue is one FIFO per level, and batches take the
  requests of the highest level first (a batch may span levels). A request's ``priority``
  parameter picks its level; 0, an absent one or one beyond ``priority_levels`` means
  ``default_priority_level`` (``InferenceRequest::SetPriority``). Without ``priority_levels`` every
  request is at one level.
- Each level has its queue policy: ``priority_queue_policy[level]``, else ``default_queue_policy``.
  ``max_queue_size`` bounds the level's queue (more gets UNAVAILABLE "[request id: <id>] Exceeds
  maximum queue size"); ``default_timeout_microseconds`` is how long a request may wait, which its
  ``timeout`` parameter (microseconds) may shorten, never lengthen, when ``allow_timeout_override``
  is set. Past it, ``timeout_action: REJECT`` fails the request (UNAVAILABLE "Request timeout
  expired") and ``DELAY`` moves it behind the unexpired requests of its level, where it still runs.
- ``preserve_ordering``: answers leave in the order the requests were dispatched (their arrival
  order, as the configuration allows one level and no DELAY then), even when a later batch on
  another instance finishes first.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, BatchStrategy, Executable, Execution, Parameter, RequestContext
from kserve_v2.protocol.errors import InternalError, InvalidInput, Overloaded, Unavailable
from kserve_v2.scheduling.base import Execute, Feeds, Key, Outcome, Pending, fail_pending, model_time
from kserve_v2.scheduling.instances import InstancePool, nbytes

# (feeds, V2 batch size) -> the request's size in the batch limit
Items = Callable[[Feeds, int], int]
# Request parameters Triton's frontends take for themselves (the parameters extension): never part of a batch key
RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                                 "binary_data_output"})
TIMEOUT_EXPIRED = "Request timeout expired"  # Triton's text for a request rejected by its queue policy


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


def request_priority(parameters: Mapping[str, Parameter]) -> int:
    """The request's ``priority`` parameter (0 when absent: the default level).

    Raises:
        InvalidInput: not an integer, or negative (Triton's texts) -> INVALID_ARGUMENT / 400.
    """
    return _unsigned(parameters, "priority", "int64_param or uint64_param")


def request_timeout_us(parameters: Mapping[str, Parameter]) -> int:
    """The request's ``timeout`` parameter in microseconds (0 when absent: the queue policy's own).

    Raises:
        InvalidInput: not an integer, or negative -> INVALID_ARGUMENT / 400.
    """
    return _unsigned(parameters, "timeout", "int64_param")


def _unsigned(parameters: Mapping[str, Parameter], name: str, kinds: str) -> int:
    value = parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"invalid value type for '{name}' parameter, expected {kinds}.")
    if value < 0:
        raise InvalidInput(f"invalid value for '{name}', expected value >= 0.")
    return value


@dataclass(slots=True, eq=False)
class _Level:
    """One priority level's queue (Triton's ``PolicyQueue``): unexpired requests, then those
    ``DELAY`` moved behind them."""

    policy: mc.ModelQueuePolicy
    kept: bool  # configured: stays when empty (others are made on use and dropped when empty)
    queue: deque[Pending] = field(default_factory=deque)
    delayed: deque[Pending] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


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
        self._max_level = config.priority_levels
        self._default_level = config.default_priority_level if config.priority_levels else 0
        self._default_policy = config.default_queue_policy
        self._levels: dict[int, _Level] = {}
        if self._max_level:
            for level, policy in config.priority_queue_policy.items():
                self._levels[level] = _Level(policy, True)
        else:
            self._levels[0] = _Level(self._default_policy, True)
        self._order = sorted(self._levels)  # the levels, highest priority (lowest number) first
        self._size = 0  # requests queued, all levels
        self._preserve = config.preserve_ordering
        self._dispatched: deque[Pending] = deque()  # preserve_ordering: dispatched, answer not yet released
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
        priority = request_priority(parameters)
        timeout_us = request_timeout_us(parameters)
        fast = self._fast
        if (fast is not None and self.forms_batch_of_one() and not self._dispatched
                and fast.runs_inline(nbytes(feeds))):
            executable = fast.executable
            execution, started, finished = fast.inline(lambda: executable.execute(feeds, output_names, parameters,
                                                                                  context))
            return execution, 0, model_time(execution, started, finished)
        if priority == 0 or priority > self._max_level:  # Triton's InferenceRequest::SetPriority
            priority = self._default_level
        level = self._level(priority)
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise Overloaded(f"[request id: {context.id or '<id_unknown>'}] Exceeds maximum queue size")
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        if self._items is not None:
            batch_size = self._items(feeds, batch_size)
        now = time.perf_counter_ns()
        timeout_us = (timeout_us if policy.allow_timeout_override and 0 < timeout_us < policy.default_timeout_microseconds
                      else policy.default_timeout_microseconds)
        request = Pending(feeds, output_names, parameters, self._key(feeds, output_names, parameters), now,
                          asyncio.get_running_loop().create_future(), batch_size, context=context, priority=priority,
                          deadline_ns=now + timeout_us * 1000 if timeout_us else 0)
        level.queue.append(request)
        self._size += 1
        self._arrived.set()
        expiry = (asyncio.get_running_loop().call_later(timeout_us / 1e6, self._expire, request)
                  if timeout_us and policy.timeout_action == mc.ModelQueuePolicy.REJECT else None)
        try:
            outcome = await request.future
        except asyncio.CancelledError:  # the caller went away or its deadline passed: leave the queue now
            self._leave(request)
            raise
        except Exception:
            if request.released is not None:
                await request.released
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        if request.released is not None:  # preserve_ordering: after every request dispatched before it
            await request.released
        return outcome

    def _level(self, priority: int) -> _Level:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level(self._default_policy, False)
            bisect.insort(self._order, priority)
        return level

    def _leave(self, request: Pending) -> None:
        level = self._levels.get(request.priority)
        if level is None:
            return
        for queue in (level.queue, level.delayed):
            try:
                queue.remove(request)
            except ValueError:
                continue
            self._size -= 1
            return
        # already taken into a batch (whose execution stops when all its members are gone)

    def _expire(self, request: Pending) -> None:
        """Reject a request still queued when its queue policy's timeout passes (``REJECT``)."""
        if not request.future.done():
            size = self._size
            self._leave(request)
            if self._size < size:
                request.future.set_exception(Unavailable(TIMEOUT_EXPIRED))

    def forms_batch_of_one(self) -> bool:
        """Whether a request arriving now would be dispatched alone at once: the loop holds a free
        instance, the queue is empty and there is no queue delay to wait for others."""
        return self._waiting and not self._delay_ns and not self._size

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
            if self._preserve:
                self._hold_answers(batch)
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _hold_answers(self, batch: list[Pending]) -> None:
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

    def _queued(self) -> Iterator[Pending]:
        """The queue in batching order: level by level, each level's unexpired requests then its delayed ones."""
        for priority in self._order:
            level = self._levels[priority]
            yield from level.queue
            yield from level.delayed

    def _take(self, count: int) -> list[Pending]:
        """Remove the first ``count`` requests of ``_queued``."""
        taken: list[Pending] = []
        for priority in self._order:
            level = self._levels[priority]
            for queue in (level.queue, level.delayed):
                while queue and len(taken) < count:
                    taken.append(queue.popleft())
        self._size -= len(taken)
        return taken

    async def _next_batch(self) -> list[Pending]:
        while True:
            self._apply_policies()
            if not self._size:
                self._arrived.clear()
                self._waiting = True
                try:
                    await self._arrived.wait()
                finally:
                    self._waiting = False
                continue
            candidates: list[Pending] = []
            total = 0
            for request in self._queued():
                if candidates and (request.key != candidates[0].key or total + request.batch_size > self._max_batch):
                    break
                candidates.append(request)  # the first always runs (its size was checked against the model)
                total += request.batch_size
                if total >= self._max_batch:
                    break
            taken = len(candidates)
            sizes = list(itertools.accumulate(r.batch_size for r in candidates))
            preferred = [i + 1 for i, size in enumerate(sizes) if size in self._preferred]
            can_grow = taken == self._size and total < self._max_batch
            now = time.perf_counter_ns()
            waited = now - min(r.enqueued_ns for r in candidates)
            if preferred or not can_grow or waited >= self._delay_ns:
                return self._take(preferred[-1] if preferred else taken)
            wait_ns = self._delay_ns - waited
            deadlines = [r.deadline_ns for r in candidates if r.deadline_ns]
            if deadlines:  # a member's timeout may reorder (DELAY) or shrink (REJECT) the batch
                wait_ns = min(wait_ns, max(0, min(deadlines) - now) + 1000)
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_ns / 1e9)
            except TimeoutError:
                pass

    def _apply_policies(self) -> None:
        """Forget cancelled requests; reject (``REJECT``) or move behind their level (``DELAY``)
        those past their timeout; drop empty levels made on use."""
        now = time.perf_counter_ns()
        for priority in list(self._order):
            level = self._levels[priority]
            delay = level.policy.timeout_action == mc.ModelQueuePolicy.DELAY
            kept: deque[Pending] = deque()
            for request in level.queue:
                if request.future.done():
                    self._size -= 1
                elif request.deadline_ns and now > request.deadline_ns:
                    if delay:
                        level.delayed.append(request)
                    else:
                        self._size -= 1
                        request.future.set_exception(Unavailable(TIMEOUT_EXPIRED))
                else:
                    kept.append(request)
            level.queue = kept
            if any(r.future.done() for r in level.delayed):
                self._size -= sum(r.future.done() for r in level.delayed)
                level.delayed = deque(r for r in level.delayed if not r.future.done())
            if not level.kept and not level:
                del self._levels[priority]
                self._order.remove(priority)

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
    """Tensor models batch requests with the same outputs, parameters (but Triton's reserved ones,
    ``RESERVED_PARAMETERS``: requests differing in priority or timeout still batch together) and
    non-batch input shapes."""
    return (tuple(output_names),
            tuple(sorted((k, str(v)) for k, v in parameters.items() if k not in RESERVED_PARAMETERS)),
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
