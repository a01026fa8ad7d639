"""The sequence batcher's row composition, apart from its event loop (``kserve_v2.scheduling.sequence_batcher``): pure
functions of a version's ``SequenceSettings`` and the requests at hand (Triton's ``model_configuration.md``
"Sequence Batcher", and its ``sequence_batch_scheduler.cc``).

- ``sequence_parameters``: a request's correlation id, START and END, checked with Triton's texts.
- ``choose``: which sequences an instance's next execution takes (the oldest waiting requests with
  one batch key), and whether it goes now (direct: every occupied slot has a request; oldest: a
  ``preferred_batch_size`` or the most rows) or waits for the strategy's queue delay.
- ``layout``: their rows; direct puts each at its slot, with padding rows between.
- ``row_feeds`` / ``padding_feeds``: one row's model inputs: the request's (zeros for padding),
  its START / END / READY / CORRID controls and its implicit state.
- ``state_rows``: a row's state outputs, kept for the sequence's next request.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kserve_v2.backend import Parameter
from kserve_v2.protocol.datatypes import BYTES
from kserve_v2.protocol.errors import InternalError, InvalidInput
from kserve_v2.protocol.reserved import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_PARAMETERS, SEQUENCE_START
from kserve_v2.scheduling.sequence_config import END, READY, START, Control, SequenceSettings

_UINT64 = 2**64
CorrelationId = int | str
Feeds = dict[str, np.ndarray]


def sequence_parameters(settings: SequenceSettings, parameters: Mapping[str, Parameter],
                        new_id: Callable[[], CorrelationId] | None = None
                        ) -> tuple[CorrelationId, bool, bool, dict[str, Parameter]]:
    """(correlation id, START, END, the other parameters) of a request, checked against the CORRID control.

    An integer id is read as a uint64 (an int64 on the wire carries one, as Triton reads it). In an
    iterative sequence (``settings.iterative``) a request without an id (none, 0 or "") gets
    ``new_id()`` and START alone (Triton's ``IterativeSequencer``: its own flags are replaced).

    Raises:
        InvalidInput: an id that is neither an integer nor a string, a zero or empty id, or a string id
            for an integer CORRID or the reverse (Triton's texts) -> INVALID_ARGUMENT.
    """
    rest = {k: v for k, v in parameters.items() if k not in SEQUENCE_PARAMETERS}
    corrid = parameters.get(SEQUENCE_ID, 0)
    if isinstance(corrid, bool) or not isinstance(corrid, int | str):
        raise InvalidInput(f"parameter '{SEQUENCE_ID}' must be an integer or a string")
    if isinstance(corrid, int):
        corrid %= _UINT64
    if corrid in (0, "") and settings.iterative and new_id is not None:
        return new_id(), True, False, rest
    if corrid in (0, ""):
        raise InvalidInput(f"inference request to model '{settings.model}' must specify a non-zero or non-empty "
                           "correlation ID")
    control = settings.corrid
    if control is not None and isinstance(corrid, str) != (control.dtype is BYTES):
        sent = "BYTES" if isinstance(corrid, str) else "UINT64"
        raise InvalidInput(f"sequence batching control '{control.name}' data-type is '{sent}', but model "
                           f"'{settings.model}' expects '{control.dtype.v2}'")
    return corrid, bool(parameters.get(SEQUENCE_START, False)), bool(parameters.get(SEQUENCE_END, False)), rest


@dataclass(frozen=True, slots=True)
class Head:
    """The oldest waiting request of one sequence: its batch key and when it was queued (ns)."""

    key: Hashable
    enqueued_ns: int


def choose(heads: Sequence[Head], settings: SequenceSettings, occupied: int, now_ns: int) -> tuple[list[int], int]:
    """The sequences an instance's next execution takes, and how long to wait for more.

    Args:
        heads: the head request of each of the instance's sequences that has one (at least one).
        settings: the version's sequence batching.
        occupied: the instance's slots that hold a sequence.
        now_ns: the time now, on the clock of ``enqueued_ns``.

    Returns:
        (indices into ``heads``, oldest request first: those with the oldest request's batch key, at
        most ``max_batch``, cut to the largest ``preferred_batch_size`` they reach under oldest;
        ns to wait before taking them, 0 when they go now: direct goes once every occupied slot has
        a request, oldest at a preferred size or ``max_batch``, both once the oldest has waited the delay).
    """
    order = sorted(range(len(heads)), key=lambda i: heads[i].enqueued_ns)
    key = heads[order[0]].key
    chosen = [i for i in order if heads[i].key == key][: settings.max_batch]
    waited = now_ns - heads[chosen[0]].enqueued_ns
    if settings.oldest:
        preferred = [n for n in settings.preferred if n <= len(chosen)]
        chosen = chosen[: preferred[-1]] if preferred else chosen
        go = bool(preferred) or len(chosen) >= settings.max_batch
    else:
        go = len(chosen) == occupied
    return chosen, 0 if go or waited >= settings.delay_ns else settings.delay_ns - waited


def layout(slots: Sequence[int], settings: SequenceSettings, highest: int) -> list[int | None]:
    """An execution's rows: for each, the index into ``slots`` (the taken sequences' slots, in the
    order taken) of its sequence, or None for a padding row.

    Oldest, and a model without batching, take the rows in order without padding; direct puts each
    sequence at the row of its slot, up to ``highest`` (the instance's highest occupied slot), as
    Triton's direct scheduler sends them.
    """
    if settings.oldest or not settings.batched:
        return list(range(len(slots)))
    rows: list[int | None] = [None] * (highest + 1)
    for index, slot in enumerate(slots):
        rows[slot] = index
    return rows


def initial_states(settings: SequenceSettings) -> list[np.ndarray]:
    """The state a sequence starts with: each implicit state's initial value."""
    return [s.initial for s in settings.states]


def row_feeds(settings: SequenceSettings, feeds: Feeds, start: bool, end: bool, ready: bool, corrid: CorrelationId,
              states: Sequence[np.ndarray]) -> Feeds:
    """One row's model inputs: ``feeds`` (not changed) with its controls and state inputs added.

    Controls are [1] tensors, [1, 1] with the batch dim; states gain the batch dim when batched.
    """
    row = dict(feeds)
    for control in settings.flags:
        on = {START: start, END: end, READY: ready}[control.kind]
        row[control.name] = _shaped(settings, control.true if on else control.false)
    if settings.corrid is not None:
        row[settings.corrid.name] = _shaped(settings, _corrid_value(settings.corrid, corrid))
    for spec, value in zip(settings.states, states, strict=True):
        row[spec.input_name] = value[np.newaxis] if settings.batched else value
    return row


def padding_feeds(settings: SequenceSettings, like: Feeds) -> Feeds:
    """A padding row (direct): zero inputs shaped as ``like``'s (empty strings for BYTES), READY false,
    a zero (or empty) correlation id and the initial state."""
    blank: CorrelationId = "" if settings.corrid is not None and settings.corrid.dtype is BYTES else 0
    return row_feeds(settings, {name: _blank(array) for name, array in like.items()}, False, False, False, blank,
                     initial_states(settings))


def state_rows(settings: SequenceSettings, outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A row's state outputs (``settings.states`` order), copied out of the batch's buffers (only the row is kept).

    Raises:
        InternalError: a state output whose shape is not the state's dims -> INTERNAL.
    """
    kept = []
    for spec, output in zip(settings.states, outputs, strict=True):
        row = output[0] if settings.batched and output.ndim else output
        if row.shape != spec.initial.shape:
            raise InternalError(f"state output '{spec.output_name}' has shape {list(row.shape)}, "
                                f"but the state's dims are {list(spec.initial.shape)}")
        kept.append(np.array(row))
    return kept


def _shaped(settings: SequenceSettings, value: np.ndarray) -> np.ndarray:
    """A control value as a [1] tensor, or [1, 1] with the batch dim."""
    return value.reshape((1, 1) if settings.batched else (1,))


def _blank(array: np.ndarray) -> np.ndarray:
    """Zeros (empty strings for BYTES) of one row of ``array``."""
    if array.dtype == object:
        return np.full(array.shape, b"", dtype=object)
    return np.zeros_like(array)


def _corrid_value(control: Control, corrid: CorrelationId) -> np.ndarray:
    if control.dtype is BYTES:
        text = corrid if isinstance(corrid, str) else str(corrid)
        return np.array(text.encode("utf-8"), dtype=object)
    return np.array(corrid, dtype=np.uint64).astype(control.dtype.numpy)
