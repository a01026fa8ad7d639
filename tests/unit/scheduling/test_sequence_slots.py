"""Where the sequence batcher's sequences live (kserve_v2.scheduling.sequence_slots; Triton's
SequenceBatchScheduler): the least loaded instance, a free slot or the backlog, the slot handed to the
oldest backlogged sequence on release, and the ids an iterative sequence gets."""

from __future__ import annotations

import asyncio
from pathlib import Path

from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.scheduling.sequence_config import SequenceSettings
from kserve_v2.scheduling.sequence_slots import SequenceSlots


def slots(instances: int, per_instance: int) -> SequenceSlots:
    config = text_format.Parse(f"name: 'm' max_batch_size: {per_instance} sequence_batching {{ }}", mc.ModelConfig())
    return SequenceSlots(SequenceSettings.from_config(config, Path("."), (), ()), instances)


def test_sequences_fill_the_least_loaded_instance_then_wait_in_a_backlog() -> None:
    async def test() -> None:
        table = slots(2, 1)
        a, b, c, d = (table.open(corrid) for corrid in (1, 2, 3, 4))
        assert [(s.lane.index, s.slot) for s in (a, b, c, d)] == [(0, 0), (1, 0), (0, None), (1, None)]
        assert table.sequences == 4 and table.active(3) is c
        table.release(a)  # its slot goes to the instance's oldest backlogged sequence
        assert (c.slot, table.active(1), table.sequences) == (0, None, 3) and c.lane.wake.is_set()
        table.end(d)  # END queued: no longer active, still bound until released
        assert table.active(4) is None and table.sequences == 3
        table.release(d)
        table.release(d)  # once only
        assert table.sequences == 2
        table.clear()

    asyncio.run(test())


def test_an_iterative_sequence_id_skips_the_active_ones() -> None:
    async def test() -> None:
        table = slots(1, 4)
        first = table.new_id()
        table.open(2)
        assert (first, table.new_id(), table.new_id()) == (1, 3, 4)
        table.clear()

    asyncio.run(test())
