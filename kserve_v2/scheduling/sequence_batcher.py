"""Triton's sequence batcher for one model version (``architecture.md`` "Stateful Models",
``model_configuration.md`` "Sequence Batcher").

A request joins a sequence through its parameters ``sequence_id`` (uint64, or a string),
``sequence_start`` and ``sequence_end``; id 0 or "" means no sequence. A sequence is bound, at
its START, to one model instance (a *lane*: one execution at a time, so a sequence's requests run
in order and each sees the state the previous one left) and to a slot of that instance; when every
slot is taken it waits in the instance's backlog. Each execution takes the oldest waiting request
of each of the instance's sequences (at most ``max_batch_size`` rows, with equal non-batch shapes):

- ``direct``: row = slot; slots between used ones are padding rows (zero inputs, READY false),
  as Triton's direct scheduler sends them;
- ``oldest``: rows are the sequences with the oldest requests, no padding; the batch waits up to
  ``max_queue_delay_microseconds`` to reach a ``preferred_batch_size`` or ``max_batch_size``.

The server fills the control inputs (START, END, READY, CORRID) and the implicit state inputs of
every row, keeps each state output for the sequence's next request, resets state on START and
drops it at END or when the sequence has been idle (nothing queued or running) for
``max_sequence_idle_microseconds``; a sequence leaves nothing behind once released. What rows an
execution takes and what each row is fed is worked out in ``kserve_v2.scheduling.sequence_rows``; where
each sequence is bound and when it is released, in ``kserve_v2.scheduling.sequence_slots``; this
module runs each instance's executions.

With ``iterative_sequence`` (Triton's core ``IterativeSequencer``), a request without a correlation
id starts a sequence of its own (ids 1, 2, ... that no active sequence holds), and a sequence ends
once a request of it is answered and none is queued. A request its backend gives back
(``kserve_v2.backend.rescheduling.Rescheduled``: a python model's ``set_release_flags`` with
``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``) goes back to the head of its sequence's queue with
START and END cleared, and runs again in its slot, with the state its sequence has; its caller
waits on. Without ``iterative_sequence`` (or for an END request) it fails with Triton's
INVALID_ARGUMENT text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kserve_v2.backend import NO_CONTEXT, Execution, Parameter, RequestContext
from kserve_v2.backend.rescheduling import NOT_CONFIGURED, Rescheduled
from kserve_v2.protocol.errors import InternalError, InvalidInput
from kserve_v2.protocol.reserved import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START
from kserve_v2.scheduling.base import Execute, Feeds, Outcome, SequenceRequest, fail_pending, model_time
from kserve_v2.scheduling.batch_rows import row_key
from kserve_v2.scheduling.instances import InstancePool
from kserve_v2.scheduling.sequence_config import SequenceSettings
from kserve_v2.scheduling.sequence_rows import (Head, choose, initial_states, layout, padding_feeds, row_feeds,
                                                sequence_parameters, state_rows)
from kserve_v2.scheduling.sequence_slots import Lane, SequenceSlots, SequenceState

# (sequence, request) for a real row, None for a padding row
_Row = tuple[SequenceState, SequenceRequest] | None


class SequenceBatcher:
    """Routes, batches and executes the requests of one sequence-batched version (see the module
    docstring); a ``Scheduler``.

    Args:
        settings: the version's sequence batching.
        instances: model instances (lanes), the instance group count.
        execute: merges, runs and splits one batch on a model instance (``dynamic_batcher.batch_executor``).
        pool: the version's instances, released by ``close``; None for a batcher that owns none.
    """

    def __init__(self, settings: SequenceSettings, instances: int, execute: Execute,
                 pool: InstancePool | None = None) -> None:
        self._settings = settings
        self._execute = execute
        self._pool = pool
        self._slots = SequenceSlots(settings, instances)

    @property
    def sequences(self) -> int:
        """Sequences holding a slot or waiting in a backlog."""
        return self._slots.sequences

    async def submit(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                     batch_size: int, context: RequestContext = NO_CONTEXT) -> Outcome:
        """Queue one request of a sequence and wait for its row of an execution: (execution, queue_ns,
        infer_ns), as ``Scheduler.submit``.

        Raises:
            InvalidInput: a batch size other than 1; a bad ``sequence_id`` (``sequence_rows.sequence_parameters``);
                a request without START for a sequence that is not active (never started, ended, or
                expired) — Triton's texts -> INVALID_ARGUMENT.
            Unavailable: the version was retired while the request waited -> UNAVAILABLE.
            Whatever the execution raised.
        """
        settings = self._settings
        if batch_size != 1:
            raise InvalidInput(f"inference request to model '{settings.model}' must specify batch-size 1 due to "
                               "requirements of sequence batcher")
        slots = self._slots
        corrid, start, end, parameters = sequence_parameters(settings, parameters, slots.new_id)
        if settings.iterative:  # the backend sees the id and flags the sequence batcher gave the request
            context = replace(context, parameters={**context.parameters, SEQUENCE_ID: corrid, SEQUENCE_START: start,
                                                   SEQUENCE_END: end})
        sequence = slots.active(corrid)
        if sequence is None:
            if not start:
                raise InvalidInput(f"inference request for sequence {corrid} to model '{settings.model}' must "
                                   "specify the START flag on the first request of the sequence")
            sequence = slots.open(corrid)
        now = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        request = SequenceRequest(feeds, output_names, parameters, row_key(feeds, output_names, parameters), now,
                                  loop.create_future(), context, start=start, end=end)
        sequence.pending.append(request)
        sequence.last_ns = now
        if end:
            slots.end(sequence)  # a later request with this id must START a new sequence
        lane = sequence.lane
        if lane.task is None:
            lane.task = loop.create_task(self._schedule(lane))
        lane.wake.set()
        return await request.future  # a cancelled caller cancels the future: the lane skips it

    def stop(self) -> None:
        """Stop scheduling (the version is retired): queued requests fail, every sequence and state is dropped."""
        self._slots.clear()

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking; see ``Scheduler.close``)."""
        if self._pool is not None:
            self._pool.close()

    # ---- scheduling -------------------------------------------------------------------------

    async def _schedule(self, lane: Lane) -> None:
        """Form and run the instance's batches one after another (so every sequence's state is current)."""
        while True:
            rows = await self._next_batch(lane)
            try:
                await self._run(rows)
            except Exception as err:  # noqa: BLE001 - a broken batch must not stop the instance
                for sequence, request in (row for row in rows if row is not None):
                    sequence.running = False
                    fail_pending([request], InternalError(f"sequence batch failed: {err}"))
                    self._finished(sequence, request)

    async def _next_batch(self, lane: Lane) -> list[_Row]:
        """Wait for the instance's next batch (``sequence_rows.choose``) and take its rows."""
        while True:
            ready = self._ready(lane)
            if not ready:
                lane.wake.clear()
                await lane.wake.wait()
                continue
            occupied = sum(s is not None for s in lane.slots)
            chosen, wait_ns = choose([Head(s.pending[0].key, s.pending[0].enqueued_ns) for s in ready], self._settings,
                                     occupied, time.perf_counter_ns())
            if not wait_ns:
                return self._rows(lane, [ready[i] for i in chosen])
            lane.wake.clear()
            try:
                await asyncio.wait_for(lane.wake.wait(), wait_ns / 1e9)
            except TimeoutError:
                pass

    def _ready(self, lane: Lane) -> list[SequenceState]:
        """The instance's sequences with a live request at the head of their queue (cancelled ones dropped)."""
        ready = []
        for sequence in lane.slots:
            if sequence is None:
                continue
            while sequence.pending and sequence.pending[0].future.done():
                self._finished(sequence, sequence.pending.popleft())
            if sequence.pending and sequence.slot is not None:
                ready.append(sequence)
        return ready

    def _rows(self, lane: Lane, chosen: list[SequenceState]) -> list[_Row]:
        """Take each chosen sequence's head request, in the rows ``sequence_rows.layout`` gives."""
        taken = [(s, s.pending.popleft()) for s in chosen]
        for sequence in chosen:
            sequence.running = True
        highest = max(i for i, s in enumerate(lane.slots) if s is not None)
        return [None if index is None else taken[index]
                for index in layout([s.slot or 0 for s in chosen], self._settings, highest)]

    async def _run(self, rows: list[_Row]) -> None:
        """Execute one batch: feed controls and states, store the new states, answer each request."""
        settings = self._settings
        real = [row for row in rows if row is not None]
        first = real[0][1]
        members = [self._feeds(row, first.feeds) for row in rows]
        names = list(first.output_names)
        try:
            lane = real[0][0].lane.index  # the execution runs on the lane's instance
            contexts = [NO_CONTEXT if row is None else replace(row[1].context, instance=lane)  # padding rows: none
                        for row in rows]
            shares, started, finished = await self._execute(members, names + settings.state_outputs, first.parameters,
                                                            contexts)
        except asyncio.CancelledError:
            fail_pending(request for _, request in real)
            raise
        except Exception as err:  # noqa: BLE001 - every request of the batch gets its error
            shares, started, finished = [err] * len(rows), 0, 0
        executions = 1
        again: list[SequenceRequest] = []
        for row, share in zip(rows, shares, strict=True):
            if row is None:
                continue
            sequence, request = row
            sequence.running, sequence.last_ns = False, time.perf_counter_ns()
            if isinstance(share, Rescheduled) and settings.iterative and not request.end:
                if self._again(sequence, request):
                    again.append(request)
                continue
            outcome: BaseException | Outcome
            if isinstance(share, Rescheduled):
                outcome = InvalidInput(NOT_CONFIGURED)
            elif isinstance(share, Exception):
                outcome = share
            else:
                try:
                    sequence.state = state_rows(settings, share.outputs[len(names):])
                except InternalError as err:
                    outcome = err
                else:
                    answer = Execution(share.outputs[: len(names)], share.pre_ns, share.post_ns, share.tokens,
                                       executions + request.owed, len(rows))  # batch_stats: its rows, padding too
                    outcome = (answer, started - request.enqueued_ns, model_time(answer, started, finished))
                    executions = 0
            if not request.future.done():
                if isinstance(outcome, BaseException):
                    request.future.set_exception(outcome)
                else:
                    request.future.set_result(outcome)
            self._finished(sequence, request)
        if executions and again:  # no answer counted this execution: the request answered last will
            again[0].owed += 1

    def _again(self, sequence: SequenceState, request: SequenceRequest) -> bool:
        """Queue a request its backend gave back at the head of its sequence's queue, START and END
        cleared (Triton's ``IterativeSequencer``); False when its caller went away meanwhile."""
        if request.future.done():
            self._finished(sequence, request)
            return False
        request.start = request.end = False
        request.context = replace(request.context, parameters={**request.context.parameters, SEQUENCE_START: False,
                                                               SEQUENCE_END: False})
        request.enqueued_ns = sequence.last_ns
        sequence.pending.appendleft(request)
        sequence.lane.wake.set()
        return True

    def _finished(self, sequence: SequenceState, request: SequenceRequest) -> None:
        """``request`` of ``sequence`` has its outcome (or its caller went away): END releases the
        sequence, and so, in an iterative sequence, does the last request it has."""
        if request.end or (self._settings.iterative and not sequence.pending and not sequence.running):
            self._slots.release(sequence)

    def _feeds(self, row: _Row, like: Feeds) -> Feeds:
        """A row's model inputs (``sequence_rows.row_feeds``); a START resets the sequence's state."""
        settings = self._settings
        if row is None:
            return padding_feeds(settings, like)
        sequence, request = row
        if request.start or sequence.state is None:
            sequence.state = initial_states(settings)
        return row_feeds(settings, request.feeds, request.start, request.end, True, sequence.corrid, sequence.state)
