"""Where the sequence batcher's sequences live (Triton's ``SequenceBatchScheduler``: the correlation
id -> batch slot map, the backlog and the idle-sequence reaper), apart from how each instance runs
them (``kserve_v2.scheduling.sequence_batcher``).

A sequence is bound, at its START, to one model instance (a *lane*) and to a slot of it: the least
loaded instance, in a free slot, else in that instance's backlog until a slot frees. It is active
(accepts requests) until its END; its slot and state are released at its END, when its iterative
sequence is answered, or once it has been idle (nothing queued or running) for
``max_sequence_idle_microseconds``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kserve_v2.scheduling.base import SequenceRequest, fail_pending
from kserve_v2.scheduling.sequence_config import SequenceSettings
from kserve_v2.scheduling.sequence_rows import CorrelationId

_UINT64_MAX = 2**64 - 1


@dataclass(slots=True, eq=False)
class SequenceState:
    """One sequence: its instance and slot, its waiting requests and its implicit state."""

    corrid: CorrelationId
    lane: Lane
    slot: int | None = None  # None while in the backlog
    pending: deque[SequenceRequest] = field(default_factory=deque)
    state: list[np.ndarray] | None = None  # one row (no batch dim) per implicit state
    last_ns: int = 0  # when it last had a request queued or answered (time.perf_counter_ns)
    running: bool = False
    released: bool = False


@dataclass(slots=True, eq=False)
class Lane:
    """One model instance: its slots, its backlog and its scheduling task."""

    slots: list[SequenceState | None]
    index: int  # the model instance it is (RequestContext.instance)
    backlog: deque[SequenceState] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def load(self) -> int:
        """Sequences holding a slot or waiting in the backlog."""
        return sum(s is not None for s in self.slots) + len(self.backlog)

    def free_slot(self) -> int | None:
        """The first free slot; None when every slot is taken."""
        return next((i for i, s in enumerate(self.slots) if s is None), None)

    def bound(self) -> list[SequenceState]:
        """Its sequences: those in a slot, then the backlog."""
        return [s for s in self.slots if s is not None] + list(self.backlog)


class SequenceSlots:
    """The sequences of one sequence-batched version and the instances they are bound to (see the
    module docstring). Event loop only.

    Args:
        settings: the version's sequence batching.
        instances: model instances (lanes), the instance group count.
    """

    def __init__(self, settings: SequenceSettings, instances: int) -> None:
        self._idle_ns = settings.idle_ns
        self.lanes = [Lane([None] * settings.slots, index) for index in range(max(instances, 1))]
        self._active: dict[CorrelationId, SequenceState] = {}  # sequences that still accept requests
        self._reaper: asyncio.Task[None] | None = None
        self._reaper_wake = asyncio.Event()
        self._next_id = 1  # the next correlation id an iterative sequence's request without one may get

    @property
    def sequences(self) -> int:
        """Sequences holding a slot or waiting in a backlog."""
        return sum(lane.load() for lane in self.lanes)

    def active(self, corrid: CorrelationId) -> SequenceState | None:
        """The sequence that accepts requests with this id; None when there is none."""
        return self._active.get(corrid)

    def new_id(self) -> CorrelationId:
        """A correlation id for an iterative sequence's request without one: the next of 1, 2, ... that
        no active sequence holds (Triton's ``IterativeSequencer`` counts from 1)."""
        while self._next_id in self._active:
            self._next_id = self._next_id % _UINT64_MAX + 1
        corrid, self._next_id = self._next_id, self._next_id % _UINT64_MAX + 1
        return corrid

    def open(self, corrid: CorrelationId) -> SequenceState:
        """A new active sequence on the least loaded instance: in a free slot, else in that instance's
        backlog. The idle reaper runs while any sequence is bound."""
        with_slot = [lane for lane in self.lanes if lane.free_slot() is not None]
        lane = min(with_slot or self.lanes, key=Lane.load)
        sequence = SequenceState(corrid, lane)
        slot = lane.free_slot()
        if slot is None:
            lane.backlog.append(sequence)
        else:
            sequence.slot, lane.slots[slot] = slot, sequence
        self._active[corrid] = sequence
        self._reaper_wake.set()
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return sequence

    def end(self, sequence: SequenceState) -> None:
        """The sequence takes no more requests (its END is queued): a later request with its id must START anew."""
        del self._active[sequence.corrid]

    def release(self, sequence: SequenceState) -> None:
        """Free a sequence's slot (to the oldest backlogged sequence of its instance) and its state."""
        if sequence.released:
            return
        sequence.released = True
        lane = sequence.lane
        if self._active.get(sequence.corrid) is sequence:
            del self._active[sequence.corrid]
        sequence.state = None
        if sequence.slot is None:
            lane.backlog.remove(sequence)
            return
        slot, sequence.slot, lane.slots[slot] = sequence.slot, None, None
        if lane.backlog:
            waiting = lane.backlog.popleft()
            waiting.slot, lane.slots[slot] = slot, waiting
            lane.wake.set()

    def clear(self) -> None:
        """Drop every sequence and its state (the version is retired): their queued requests fail
        (``fail_pending``: UNAVAILABLE); the instances' tasks and the reaper stop."""
        for lane in self.lanes:
            if lane.task is not None:
                lane.task.cancel()
            for sequence in lane.bound():
                fail_pending(sequence.pending)
            lane.slots = [None] * len(lane.slots)
            lane.backlog.clear()
        self._active.clear()
        if self._reaper is not None:
            self._reaper.cancel()

    async def _reap(self) -> None:
        """Release sequences idle for longer than ``max_sequence_idle_microseconds``; ends when none is left."""
        idle_ns = self._idle_ns
        try:
            while self.sequences:
                now = time.perf_counter_ns()
                deadline = now + idle_ns
                for lane in self.lanes:
                    for sequence in lane.bound():
                        if sequence.pending or sequence.running:
                            continue
                        if now - sequence.last_ns >= idle_ns:
                            self.release(sequence)
                        else:
                            deadline = min(deadline, sequence.last_ns + idle_ns)
                self._reaper_wake.clear()
                try:
                    await asyncio.wait_for(self._reaper_wake.wait(), max(deadline - now, 1_000_000) / 1e9)
                except TimeoutError:
                    pass
        finally:
            self._reaper = None
