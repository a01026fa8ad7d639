"""Triton's priority queue, where the dynamic batcher's requests wait (its core's ``scheduler_utils.h``:
a ``PriorityQueue`` of one ``PolicyQueue`` per level; ``model_configuration.md``, "Priority" and
"Queue Policy"; the schedule-policy extension's ``priority`` and ``timeout`` parameters). How
batches are formed and dispatched is ``kserve_v2.scheduling.dynamic_batcher``'s.

- Levels: ``priority_levels`` levels, 1 the highest, each a FIFO; the queue's order is level by
  level. A request's ``priority`` of 0 or beyond ``priority_levels`` means
  ``default_priority_level`` (``InferenceRequest::SetPriority``); without ``priority_levels``
  every request is at one level.
- Policies: a level's is ``priority_queue_policy[level]``, else ``default_queue_policy``; levels
  with a configured policy stay, the others are made on use and dropped once empty.
  ``max_queue_size`` bounds the level (more gets UNAVAILABLE "[request id: <id>] Exceeds maximum
  queue size"). ``default_timeout_microseconds`` is how long a request may wait, which its
  ``timeout`` parameter may shorten, never lengthen, when ``allow_timeout_override`` is set. Past
  it, ``timeout_action: REJECT`` fails the request (UNAVAILABLE "Request timeout expired"), at
  that time even while every instance is busy (one timer, for the closest such timeout), and
  ``DELAY`` moves it behind the unexpired requests of its level, where it still runs.
- One size, kept by the queue: ``len(queue)``, the requests waiting at every level.
- The cursor: the pending batch, a prefix of the queue that the batcher grows one request at a
  time (``at_cursor``, ``advance_cursor``), with its count, its oldest request's ``enqueued_ns``
  and its closest timeout; ``dequeue`` takes the batch, or its first requests, out.
- ``clock``: nanoseconds, ``time.perf_counter_ns`` unless another is given; the requests'
  ``enqueued_ns`` and ``deadline_ns`` are on it, and the timer waits out its differences on the
  event loop's own clock.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Parameter
from kserve_v2.protocol.errors import InvalidInput, Overloaded, Unavailable
from kserve_v2.protocol.reserved import PRIORITY, TIMEOUT, TIMEOUT_EXPIRED
from kserve_v2.scheduling.base import DynamicRequest

# the time in nanoseconds, from any fixed point (time.perf_counter_ns)
Clock = Callable[[], int]


def request_priority(parameters: Mapping[str, Parameter]) -> int:
    """The request's ``priority`` parameter (0 when absent: the default level).

    Raises:
        InvalidInput: not an integer, or negative (Triton's texts) -> INVALID_ARGUMENT / 400.
    """
    return _unsigned(parameters, PRIORITY, "int64_param or uint64_param")


def request_timeout_us(parameters: Mapping[str, Parameter]) -> int:
    """The request's ``timeout`` parameter in microseconds (0 when absent: the queue policy's own).

    Raises:
        InvalidInput: not an integer, or negative -> INVALID_ARGUMENT / 400.
    """
    return _unsigned(parameters, TIMEOUT, "int64_param")


def _unsigned(parameters: Mapping[str, Parameter], name: str, kinds: str) -> int:
    value = parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"invalid value type for '{name}' parameter, expected {kinds}.")
    if value < 0:
        raise InvalidInput(f"invalid value for '{name}', expected value >= 0.")
    return value


@dataclass(slots=True, eq=False)
class _PolicyQueue:
    """One level (Triton's ``PolicyQueue``): its unexpired requests, then those ``DELAY`` moved behind them."""

    policy: mc.ModelQueuePolicy
    kept: bool  # configured: stays when empty
    queue: deque[DynamicRequest] = field(default_factory=deque)
    delayed: deque[DynamicRequest] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)

    def at(self, index: int) -> DynamicRequest:
        queue = self.queue
        return queue[index] if index < len(queue) else self.delayed[index - len(queue)]


class PriorityQueue:
    """The requests of one dynamic batcher, by priority level under each level's queue policy (see
    the module docstring). Event loop only.

    Args:
        config: the version's ``dynamic_batching`` (checked by ``dynamic_batcher.queue_policy_problem``).
        clock: the time, ns (``time.perf_counter_ns``).
    """

    def __init__(self, config: mc.ModelDynamicBatching, clock: Clock = time.perf_counter_ns) -> None:
        self.clock = clock
        self._max_level = config.priority_levels
        self._default_level = config.default_priority_level if config.priority_levels else 0
        self._default_policy = config.default_queue_policy
        if self._max_level:
            self._levels = {level: _PolicyQueue(policy, True) for level, policy in config.priority_queue_policy.items()}
        else:
            self._levels = {0: _PolicyQueue(self._default_policy, True)}
        self._order = sorted(self._levels)  # the levels, highest priority (lowest number) first
        self._size = 0
        # (deadline_ns, arrival, request) of the requests REJECT fails at their deadline, closest first
        self._expiries: list[tuple[int, int, DynamicRequest]] = []
        self._arrivals = itertools.count()
        self._expiry: asyncio.TimerHandle | None = None  # calls expire at the closest of _expiries
        self._expiry_ns = 0  # that deadline (0: none)
        self.reset_cursor()

    def __len__(self) -> int:
        """The requests waiting, every level."""
        return self._size

    def enqueue(self, request: DynamicRequest, priority: int, timeout_us: int) -> None:
        """Queue ``request`` at the end of its level, with its ``priority`` (the level) and
        ``deadline_ns`` (from its ``enqueued_ns``) set.

        Args:
            request: the request, ``enqueued_ns`` on ``clock``.
            priority: its ``priority`` parameter (``request_priority``; 0: the default level).
            timeout_us: its ``timeout`` parameter (``request_timeout_us``; 0: the policy's own).

        Raises:
            Overloaded: its level holds ``max_queue_size`` requests -> UNAVAILABLE / 503.
        """
        if priority == 0 or priority > self._max_level:  # Triton's InferenceRequest::SetPriority
            priority = self._default_level
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _PolicyQueue(self._default_policy, False)
            bisect.insort(self._order, priority)
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise Overloaded(f"[request id: {request.context.id or '<id_unknown>'}] Exceeds maximum queue size")
        if not (policy.allow_timeout_override and 0 < timeout_us < policy.default_timeout_microseconds):
            timeout_us = policy.default_timeout_microseconds
        request.priority = priority
        if timeout_us:
            request.deadline_ns = request.enqueued_ns + timeout_us * 1000
            if policy.timeout_action == mc.ModelQueuePolicy.REJECT:
                heapq.heappush(self._expiries, (request.deadline_ns, next(self._arrivals), request))
                self._watch()
        level.queue.append(request)
        self._size += 1

    def remove(self, request: DynamicRequest) -> bool:
        """Take a waiting request out (its caller went away); False when it is not waiting (taken
        into a batch, or failed)."""
        level = self._levels.get(request.priority)
        if level is None:
            return False
        for queue in (level.queue, level.delayed):
            try:
                queue.remove(request)
            except ValueError:
                continue
            self._size -= 1
            return True
        return False

    def apply_policies(self) -> None:
        """Apply every level's policy now: forget requests that have their outcome (cancelled ones),
        fail (``REJECT``) or move behind their level (``DELAY``) those past their timeout, and drop
        the empty levels made on use."""
        now = self.clock()
        for priority in list(self._order):
            level = self._levels[priority]
            delay = level.policy.timeout_action == mc.ModelQueuePolicy.DELAY
            kept: deque[DynamicRequest] = deque()
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

    def expire(self) -> None:
        """Fail the waiting requests that ``REJECT`` fails and whose timeout has passed, wherever they
        wait (Triton's ``RejectTimeoutRequests``; the timer calls it at the closest such timeout)."""
        now, expiries = self.clock(), self._expiries
        while expiries and expiries[0][0] < now:
            request = heapq.heappop(expiries)[2]
            if not request.future.done() and self.remove(request):
                request.future.set_exception(Unavailable(TIMEOUT_EXPIRED))
        self._watch()

    def close(self) -> None:
        """Stop the timer (the batcher stops)."""
        if self._expiry is not None:
            self._expiry.cancel()

    def _watch(self) -> None:
        """Keep the timer set for the closest timeout ``expire`` has to act on (requests with an outcome forgotten)."""
        expiries = self._expiries
        while expiries and expiries[0][2].future.done():
            heapq.heappop(expiries)
        deadline = expiries[0][0] if expiries else 0
        if deadline == self._expiry_ns:
            return
        self.close()
        self._expiry_ns, self._expiry = deadline, None
        if deadline:  # expired once the clock is past it
            self._expiry = asyncio.get_running_loop().call_later((deadline - self.clock() + 1) / 1e9, self._timer)

    def _timer(self) -> None:
        self._expiry_ns, self._expiry = 0, None
        self.expire()

    # ---- the pending batch ---------------------------------------------------------------------

    def reset_cursor(self) -> None:
        """Empty the pending batch: the cursor stands at the head of the queue."""
        self._cursor_level = 0  # its level's place in _order
        self._cursor_index = 0  # its place in that level: the unexpired requests, then the delayed ones
        self._pending = 0
        self._oldest_ns = 0
        self._closest_ns = 0

    @property
    def pending_count(self) -> int:
        """The requests in the pending batch."""
        return self._pending

    @property
    def oldest_enqueued_ns(self) -> int:
        """The pending batch's oldest ``enqueued_ns`` (0 while it is empty)."""
        return self._oldest_ns

    @property
    def closest_timeout_ns(self) -> int:
        """The pending batch's closest ``deadline_ns`` among its unexpired requests (0: none)."""
        return self._closest_ns

    def at_cursor(self) -> DynamicRequest | None:
        """The request after the pending batch, in the queue's order; None when the batch holds them all.
        Valid until the queue changes: the batcher walks it with no await in between."""
        order, levels = self._order, self._levels
        while self._cursor_level < len(order):
            level = levels[order[self._cursor_level]]
            if self._cursor_index < len(level):
                return level.at(self._cursor_index)
            self._cursor_level, self._cursor_index = self._cursor_level + 1, 0
        return None

    def advance_cursor(self) -> None:
        """Add the request at the cursor to the pending batch (nothing at the end)."""
        request = self.at_cursor()
        if request is None:
            return
        unexpired = self._cursor_index < len(self._levels[self._order[self._cursor_level]].queue)
        if unexpired and request.deadline_ns:
            self._closest_ns = min(self._closest_ns or request.deadline_ns, request.deadline_ns)
        self._oldest_ns = min(self._oldest_ns, request.enqueued_ns) if self._pending else request.enqueued_ns
        self._cursor_index += 1
        self._pending += 1

    def dequeue(self, count: int) -> list[DynamicRequest]:
        """Take the first ``count`` requests out, in the queue's order (the pending batch, or its
        first requests); the cursor is reset."""
        taken: list[DynamicRequest] = []
        for priority in self._order:
            level = self._levels[priority]
            for queue in (level.queue, level.delayed):
                while queue and len(taken) < count:
                    taken.append(queue.popleft())
        self._size -= len(taken)
        self.reset_cursor()
        return taken
