"""Triton's rate limiter (``docs/user_guide/rate_limiter.md``, ``src/rate_limiter.cc`` of
triton-inference-server/core): with ``--rate-limit execution_count`` an instance executes only when
the resources its instance group's ``rate_limiter`` lists are free, across every loaded model.

- **Resources.** Each instance needs ``count`` copies of each resource its group lists, on its
  device (GPU id; 0 for CPU instances), or of the one server-wide set when the resource is
  ``global``. The copies available are, per device and resource, the most any loaded instance
  needs; ``--rate-limit-resource <name>:<count>[:<device>]`` sets them instead, and then a resource
  no flag names has none (Triton's ``ParseAndValidateExplicitResources``): a version whose
  instances need more than the flags give, or a resource named both global and per device, fails
  to load with Triton's text.
- **Order.** An execution waits for a free instance of its version (the least used first) and
  is then staged; staged instances are allocated in order of their scaled priority,
  ``executions * max(priority, 1)`` (Triton's ``ScaledPriority``: an instance of priority 2 gets
  half the turns of one of priority 1), ties in staging order, and only from the head: an instance
  whose resources are busy holds back those behind it, as Triton's ``AttemptAllocation`` does.
- **Off** (the default, as in Triton): the server has no limiter (``from_settings`` gives None);
  instances run as soon as they are free and their ``rate_limiter`` settings are ignored.

Each server (``kserve_v2.app.App``) has its own limiter, which reaches the versions it loads through
its ``BackendHost`` (``kserve_v2.backend.host``, whose ``RateLimiting`` protocol it implements).
``register`` runs in the loader's threads; ``acquire`` and ``release`` on the event loop.
With ``--workers N`` each replica process has its own limiter (its own copies of every resource).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.instance_groups import instances
from kserve_v2.settings.rate_limit import EVERY_DEVICE, RateLimitMode, RateLimitResource

GLOBAL = -2  # the device key of global resources
Key = tuple[int, str]  # (device or GLOBAL, resource name)


class RateLimitError(ValueError):
    """Resources that cannot be granted; the version fails to load with this text (Triton's)."""


@dataclass(eq=False)
class Instance:
    """One instance of a version, as the limiter sees it.

    Attributes:
        needs: (device or ``GLOBAL``, resource name) -> copies it holds while it executes.
        priority: its group's ``rate_limiter.priority`` (0 counts as 1).
        executions: executions it has finished (Triton's ``exec_count``).
    """

    owner: ModelInstances = field(repr=False)
    needs: dict[Key, int]
    priority: int
    executions: int = 0

    def scaled_priority(self) -> int:
        """Triton's ``ScaledPriority``: executions * max(priority, 1); the lowest is allocated first."""
        return self.executions * max(self.priority, 1)

    def release(self, executed: bool = True) -> None:
        """Free this instance and its resources after an execution (``ModelInstances.release``; event loop only)."""
        self.owner.release(self, executed)


class ModelInstances:
    """The instances of one loaded version, registered with a limiter (``RateLimiter.register``)."""

    def __init__(self, limiter: RateLimiter, needs: Sequence[tuple[dict[Key, int], int]]) -> None:
        self._limiter = limiter
        self.instances = [Instance(self, resources, priority) for resources, priority in needs]
        self._free: list[Instance] = list(self.instances)
        self._waiting: deque[asyncio.Future[Instance]] = deque()

    async def acquire(self) -> Instance:
        """Wait for a free instance of this version and the resources it needs; both are the caller's
        until ``release`` (event loop only). Cancelling the caller gives back whatever it got."""
        future: asyncio.Future[Instance] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._limiter._stage(self)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # allocated as the caller went away
                self.release(future.result(), executed=False)
            elif future in self._waiting:
                self._waiting.remove(future)
            else:
                self._limiter._attempt()  # a staged entry of a cancelled caller: let the next one in
            raise

    def release(self, instance: Instance, executed: bool = True) -> None:
        """Free ``instance`` and its resources after an execution (event loop only)."""
        if executed:
            instance.executions += 1
        self._limiter._give_back(instance)
        self._free.append(instance)
        self._limiter._stage(self)

    def close(self) -> None:
        """Unregister: the version's resources no longer count (after its last execution)."""
        self._limiter.unregister(self)

    def _next(self) -> tuple[Instance, asyncio.Future[Instance]] | None:
        """A free instance (least scaled priority first) for the oldest waiter still waiting, or None."""
        while self._waiting and self._waiting[0].done():  # cancelled while waiting
            self._waiting.popleft()
        if not self._waiting or not self._free:
            return None
        instance = min(self._free, key=Instance.scaled_priority)
        self._free.remove(instance)
        return instance, self._waiting.popleft()


class RateLimiter:
    """The resource accounting of every loaded version's instances (one per server process).

    Args:
        explicit: the ``--rate-limit-resource`` flags; empty: each resource has the most any
            loaded instance needs.
    """

    def __init__(self, explicit: Iterable[RateLimitResource] = ()) -> None:
        self._explicit = tuple(explicit)
        self._lock = threading.Lock()
        self._models: list[ModelInstances] = []
        self._limits: dict[Key, int] = {}
        self._allocated: dict[Key, int] = {}
        self._staged: list[tuple[int, int, Instance, asyncio.Future[Instance]]] = []
        self._order = itertools.count()

    def register(self, groups: Sequence[mc.ModelInstanceGroup]) -> ModelInstances:
        """Register a version's instances: ``count`` per group, on its group's GPUs in turn (device 0 for
        CPU instances), each needing its group's ``rate_limiter.resources``.

        Raises:
            RateLimitError: a resource both global and per device ("Resource "<r>" is present as both
                global and device-specific resource in the model configuration."), or more copies
                needed than ``--rate-limit-resource`` gives ("Resource count for "<r>" is limited to
                <n> which will prevent scheduling of one or more model instances, the minimum required
                count is <m>"); nothing is registered then.
        """
        needs: list[tuple[dict[Key, int], int]] = []
        for group, instance in instances(groups):  # count on each GPU of a KIND_GPU group (Triton's instances)
            resources = {(GLOBAL if getattr(r, "global") else instance.device, r.name): r.count
                         for r in group.rate_limiter.resources}
            needs.append((resources, group.rate_limiter.priority))
        model = ModelInstances(self, needs)
        with self._lock:
            models = [*self._models, model]
            self._limits = self._compute(models)
            self._models = models
        return model

    def unregister(self, model: ModelInstances) -> None:
        """Forget a version's instances; the resources' copies are computed again without them."""
        with self._lock:
            self._models = [m for m in self._models if m is not model]
            try:
                self._limits = self._compute(self._models)
            except RateLimitError:  # fewer instances never need more than before; keep the old limits
                pass

    def limits(self) -> dict[Key, int]:
        """(device or ``GLOBAL``, resource name) -> copies available, for every resource an instance needs."""
        with self._lock:
            return dict(self._limits)

    def _compute(self, models: Sequence[ModelInstances]) -> dict[Key, int]:
        """Each resource's copies: the most an instance needs, or what the flags give (Triton's
        ``ComputeResourceLimits`` and ``ParseAndValidateResources``)."""
        most: dict[Key, int] = {}
        for model in models:
            for instance in model.instances:
                for key, count in instance.needs.items():
                    most[key] = max(most.get(key, 0), count)
        global_names = {name for device, name in most if device == GLOBAL}
        for device, name in most:
            if device != GLOBAL and name in global_names:
                raise RateLimitError(f'Resource "{name}" is present as both global and device-specific resource in '
                                     "the model configuration.")
        if not self._explicit:
            return most
        limits: dict[Key, int] = {}
        for (device, name), needed in most.items():
            given = [r.count for r in self._explicit
                     if r.name == name and (device == GLOBAL or r.device in (device, EVERY_DEVICE))]
            count = max(given, default=0)
            if count < needed:
                raise RateLimitError(f'Resource count for "{name}" is limited to {count} which will prevent scheduling '
                                     f"of one or more model instances, the minimum required count is {needed}")
            limits[(device, name)] = count
        return limits

    def _stage(self, model: ModelInstances) -> None:
        """Stage ``model``'s free instances for its waiters, then allocate what can be (event loop only)."""
        self._push(model)
        self._attempt()

    def _push(self, model: ModelInstances) -> None:
        """Stage ``model``'s free instances for its waiters, in order of scaled priority."""
        while (staged := model._next()) is not None:
            instance, future = staged
            heapq.heappush(self._staged, (instance.scaled_priority(), next(self._order), instance, future))

    def _attempt(self) -> None:
        """Allocate staged instances from the head while their resources are free (Triton's ``AttemptAllocation``)."""
        while self._staged:
            _, _, instance, future = self._staged[0]
            if future.done():  # its caller went away: the instance is free again, for its version's next waiter
                heapq.heappop(self._staged)
                instance.owner._free.append(instance)
                self._push(instance.owner)
                continue
            with self._lock:
                limits = self._limits
                if any(self._allocated.get(key, 0) + count > limits.get(key, 0) for key, count in instance.needs.items()):
                    return
                for key, count in instance.needs.items():
                    self._allocated[key] = self._allocated.get(key, 0) + count
            heapq.heappop(self._staged)
            future.set_result(instance)

    def _give_back(self, instance: Instance) -> None:
        """Free the resources ``instance`` held."""
        with self._lock:
            for key, count in instance.needs.items():
                self._allocated[key] -= count


def from_settings(mode: RateLimitMode, resources: Iterable[RateLimitResource] = ()) -> RateLimiter | None:
    """A server's limiter from ``--rate-limit`` and ``--rate-limit-resource``: a ``RateLimiter`` for
    ``execution_count``, None for ``off``."""
    return RateLimiter(resources) if mode == "execution_count" else None
