"""The scheduler seam, as Triton's server core has it: every loaded version hands its requests to
one ``Scheduler``, picked once when the version loads (``kserve_v2.models.version.open_version``).

- ``DirectScheduler``: no batching block; each request executes on its own (Triton's default
  scheduler).
- ``dynamic_batcher.DynamicBatcher``: ``dynamic_batching``; requests merge into batches.
- ``sequence_batcher.SequenceBatcher``: ``sequence_batching``; a sequence's requests run in order on one
  instance, with their controls and state.
- ``ensemble_scheduler.EnsembleScheduler``: ``ensemble_scheduling``; the steps run as requests to
  other models.

The batchers queue ``Pending`` requests (``DynamicRequest``, ``SequenceRequest``) and fail them with
``fail_pending``; ``run_inline`` is the fast path ``DirectScheduler`` and the dynamic batcher share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kserve_v2.backend import NO_CONTEXT, Execution, Parameter, RequestContext
from kserve_v2.protocol.errors import Unavailable
from kserve_v2.scheduling.instances import InstancePool, nbytes

Feeds = dict[str, np.ndarray]
# (execution, queue_ns, infer_ns): what a scheduler answers a request with
Outcome = tuple[Execution, int, int]
# (members' feeds, output names, parameters, members' contexts) -> (one execution or error per member,
# started_ns, finished_ns)
Execute = Callable[[list[Feeds], Sequence[str], Mapping[str, Parameter], Sequence[RequestContext]],
                   Awaitable[tuple[list[Execution | Exception], int, int]]]
# (feeds, output names, parameters) -> requests with equal keys may share a batch
Key = Callable[[Feeds, Sequence[str], Mapping[str, Parameter]], Hashable]
RETIRED = "the model version was retired"


class Scheduler(Protocol):
    """How one loaded version runs its requests."""

    async def submit(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                     batch_size: int, context: RequestContext = NO_CONTEXT) -> Outcome:
        """Run one decoded request and wait for its result.

        Args:
            feeds: input name -> array in the model's shape.
            output_names: outputs to return, in order.
            parameters: the request's parameters, for backends that take options.
            batch_size: the request's batch size (its share of a merged batch).
            context: the request's id, callers and response stream, for its backend.

        Returns:
            (execution, queue_ns, infer_ns): queue_ns is the wait for a batch and a free instance;
            infer_ns is the model's own time (the execution's pre and post time taken out).

        Raises:
            ServerError: the scheduler's refusals (a full queue, a bad sequence) and the
                execution's own errors; anything else the backend raised.
        """
        ...

    def stop(self) -> None:
        """Stop forming batches: the version is retired and no request uses it (event loop only)."""
        ...

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking, off the event loop)."""
        ...


@dataclass(slots=True, eq=False)
class Pending:
    """A request waiting in a batcher's queue: what both batchers keep of it (each adds its own part,
    ``DynamicRequest`` and ``SequenceRequest``).

    Attributes:
        feeds, output_names, parameters: the decoded request.
        key: requests with equal keys may share a batch.
        enqueued_ns: when it was queued (the batcher's clock, ``time.perf_counter_ns`` by default).
        future: its outcome; cancelled when its caller goes away.
        context: its id, callers and response stream, for the backend.
    """

    feeds: Feeds
    output_names: Sequence[str]
    parameters: Mapping[str, Parameter]
    key: Hashable
    enqueued_ns: int
    future: asyncio.Future[Outcome] = field(repr=False)
    context: RequestContext = NO_CONTEXT


@dataclass(slots=True, eq=False)
class DynamicRequest(Pending):
    """A request of the dynamic batcher (``kserve_v2.scheduling.priority_queue`` queues it).

    Attributes:
        batch_size: its size in the batch limit.
        priority: its priority level (lower runs first), set when it is queued.
        deadline_ns: when its queue policy's timeout expires (``enqueued_ns``'s clock; 0: never).
        released: set when every request dispatched before it has its outcome (``preserve_ordering``);
            None when its answer need not wait for others.
    """

    batch_size: int = 1
    priority: int = 0
    deadline_ns: int = 0
    released: asyncio.Future[None] | None = field(default=None, repr=False)


@dataclass(slots=True, eq=False)
class SequenceRequest(Pending):
    """A request of the sequence batcher.

    Attributes:
        start, end: its sequence flags.
        owed: executions that ran it and that no request's outcome counted yet (every row of them was
            rescheduled, ``kserve_v2.backend.rescheduling``); its outcome counts them.
    """

    start: bool = False
    end: bool = False
    owed: int = 0


def fail_pending(requests: Iterable[Pending], error: BaseException | None = None) -> None:
    """Fail every request that still waits for its outcome with ``error``; None: the version was
    retired while they waited (``Unavailable``: UNAVAILABLE / 503)."""
    if error is None:
        error = Unavailable(RETIRED)
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)


def model_time(execution: Execution, started_ns: int, finished_ns: int) -> int:
    """The model's own time in an execution that ran from ``started_ns`` to ``finished_ns``: its pre-
    and post-processing (tokenization, pooling) taken out."""
    return finished_ns - started_ns - execution.pre_ns - execution.post_ns


def run_inline(pool: InstancePool, size: int, feeds: Feeds, output_names: Sequence[str],
               parameters: Mapping[str, Parameter], context: RequestContext, submitted_ns: int) -> Outcome | None:
    """The fast path both schedulers share: a request whose execution ``pool`` measured to be tiny
    (``InstancePool.runs_inline``, with ``size`` bytes of inputs) runs alone, here on the event loop;
    its outcome (its queue time: from ``submitted_ns``, when the scheduler took it, to the execution's
    start, ``time.perf_counter_ns``), or None when it must go the ordinary way."""
    if not pool.runs_inline(size):
        return None
    executable = pool.executable
    execution, started, finished = pool.inline(lambda: executable.execute(feeds, output_names, parameters, context))
    return execution, started - submitted_ns, model_time(execution, started, finished)


class DirectScheduler:
    """Each request executes on its own, as soon as an instance is free (a version without a
    batching block); work measured to be tiny runs on the event loop (``InstancePool.runs_inline``).

    Args:
        pool: the version's instances.
    """

    def __init__(self, pool: InstancePool) -> None:
        self._pool = pool

    async def submit(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                     batch_size: int, context: RequestContext = NO_CONTEXT) -> Outcome:
        """See ``Scheduler.submit``."""
        submitted = time.perf_counter_ns()
        pool, size = self._pool, nbytes(feeds)
        outcome = run_inline(pool, size, feeds, output_names, parameters, context, submitted)
        if outcome is not None:
            return outcome
        executable = pool.executable
        execution, started, finished = await pool.run(
            lambda: executable.execute(feeds, output_names, parameters, context), size)
        return execution, started - submitted, model_time(execution, started, finished)

    def stop(self) -> None:
        """Nothing is queued here."""

    def close(self) -> None:
        """See ``Scheduler.close``."""
        self._pool.close()
