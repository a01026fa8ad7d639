"""Iterative sequences and request rescheduling in the sequence batcher (Triton's core
``IterativeSequencer``), with a stand-in backend: ids given to requests without one, a rescheduled
request run again in its sequence's instance with START cleared, the executions counted once each,
the sequence released once answered, and Triton's text where rescheduling is not configured."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter, RequestContext
from kserve_v2.backend.rescheduling import NOT_CONFIGURED, Rescheduled
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.scheduling.sequence_batcher import SequenceBatcher
from kserve_v2.scheduling.sequence_config import SequenceSettings
from kserve_v2.scheduling.sequence_rows import sequence_parameters

Feeds = dict[str, np.ndarray]


def settings(iterative: bool, instances: int = 1) -> SequenceSettings:
    config = text_format.Parse(f"name: 'm' max_batch_size: 0 sequence_batching {{ iterative_sequence: {iterative} }}",
                               mc.ModelConfig())
    return SequenceSettings.from_config(config, Path("."), (), ())


def test_the_configuration_turns_iterative_sequences_on() -> None:
    assert settings(True).iterative and not settings(False).iterative


def test_a_request_without_an_id_starts_an_iterative_sequence_of_its_own() -> None:
    ids = iter([41, 42])
    assert sequence_parameters(settings(True), {"x": 1, "sequence_end": True}, lambda: next(ids)) == (41, True, False,
                                                                                                     {"x": 1})
    assert sequence_parameters(settings(True), {"sequence_id": ""}, lambda: next(ids))[:3] == (42, True, False)
    assert sequence_parameters(settings(True), {"sequence_id": 7, "sequence_start": True}, lambda: 0)[:3] == (7, True,
                                                                                                            False)
    with pytest.raises(InvalidInput, match="must specify a non-zero or non-empty correlation ID"):
        sequence_parameters(settings(False), {}, lambda: 1)


class Backend:
    """Gives each request back ``times`` times, then answers it with its input plus the executions it saw."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.seen: list[tuple[object, object, int | None, int]] = []  # (sequence_id, sequence_start, instance, value)

    async def __call__(self, members: list[Feeds], names: Sequence[str], parameters: Mapping[str, Parameter],
                       contexts: Sequence[RequestContext]) -> tuple[list[Execution | Exception], int, int]:
        shares: list[Execution | Exception] = []
        for feeds, context in zip(members, contexts, strict=True):
            value = int(feeds["IN"][0])
            self.seen.append((context.parameters.get("sequence_id"), context.parameters.get("sequence_start"),
                              context.instance, value))
            done = sum(1 for seen in self.seen if seen[3] == value)
            shares.append(Rescheduled() if done <= self.times else Execution([np.array([value + done])]))
        return shares, 0, 0


def test_a_rescheduled_request_runs_again_in_its_sequence_until_answered() -> None:
    backend = Backend(times=2)

    async def main() -> tuple[list[int], list[int], int]:
        batcher = SequenceBatcher(settings(True), 2, backend)
        outcomes = await asyncio.gather(*(batcher.submit({"IN": np.array([v])}, ["OUT"], {}, 1) for v in (10, 20)))
        left = batcher.sequences
        batcher.stop()
        return [int(o[0].outputs[0][0]) for o in outcomes], [o[0].executions for o in outcomes], left

    answers, executions, left = asyncio.run(asyncio.wait_for(main(), 10))
    assert answers == [13, 23]
    assert executions == [3, 3]  # every execution counted once, though two of each gave their request back
    assert left == 0  # answered: the sequences are released
    for value in (10, 20):
        runs = [seen for seen in backend.seen if seen[3] == value]
        corrid, _, instance, _ = runs[0]
        assert corrid in (1, 2) and instance in (0, 1)
        assert runs == [(corrid, True, instance, value), (corrid, False, instance, value), (corrid, False, instance, value)]
    assert {runs[0] for runs in backend.seen} == {1, 2}  # each sequence had its own id


def test_rescheduling_fails_with_tritons_text_outside_an_iterative_sequence() -> None:
    async def main() -> None:
        batcher = SequenceBatcher(settings(False), 1, Backend(times=1))
        try:
            with pytest.raises(InvalidInput) as raised:
                await batcher.submit({"IN": np.array([1])}, ["OUT"], {"sequence_id": 3, "sequence_start": True}, 1)
            assert str(raised.value) == NOT_CONFIGURED
        finally:
            batcher.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
