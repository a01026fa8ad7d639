"""Dynamic-batching arithmetic (kserve_v2.scheduling.dynamic_batcher): batch keys, merging and splitting rows, and
which queued requests form one batch (Triton's dynamic batcher rules)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter
from kserve_v2.protocol.errors import InternalError, Overloaded
from kserve_v2.scheduling.dynamic_batcher import DynamicBatcher, merge_rows, row_key, split_rows

Feeds = dict[str, np.ndarray]


def rows(n: int, width: int = 2, dtype: str = "<f4") -> Feeds:
    return {"INPUT0": np.arange(n * width, dtype=dtype).reshape(n, width)}


def test_row_key_ignores_the_batch_dim_only() -> None:
    assert row_key(rows(1), ["OUTPUT0"], {}) == row_key(rows(5), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {}) != row_key(rows(1, width=3), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {}) != row_key(rows(1, dtype="<i4"), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {}) != row_key(rows(1), ["OUTPUT1"], {})
    assert row_key(rows(1), [], {"a": 1}) != row_key(rows(1), [], {"a": 2})


def test_merge_then_split_gives_each_member_its_rows() -> None:
    members = [rows(1), rows(3), rows(2)]
    merged = merge_rows(members)
    assert merged["INPUT0"].shape == (6, 2)
    shares = split_rows(Execution([merged["INPUT0"] * 2], pre_ns=5, tokens=9), [1, 3, 2])
    assert [s.outputs[0].shape[0] for s in shares] == [1, 3, 2]
    assert np.array_equal(shares[1].outputs[0], members[1]["INPUT0"] * 2)
    # the batch's tokens and its one execution are counted once, on the first member
    assert [(s.tokens, s.executions) for s in shares] == [(9, 1), (0, 0), (0, 0)]
    assert merge_rows([members[0]]) is members[0]


def test_split_refuses_an_output_without_the_batch_rows() -> None:
    with pytest.raises(InternalError, match=r"shape \[4\] for a batch of 3"):
        split_rows(Execution([np.zeros(4)]), [1, 2])


def batch_sizes(config_text: str, sizes: Sequence[int], max_batch: int = 8) -> list[list[int]]:
    """Queue requests of ``sizes`` rows at once and record the batches the batcher forms."""
    formed: list[list[int]] = []

    async def execute(members: list[Feeds], names: Sequence[str], parameters: Mapping[str, Parameter],
                      contexts: Sequence[object]) -> tuple[list[Execution | Exception], int, int]:
        formed.append([len(m["INPUT0"]) for m in members])
        merged = merge_rows(members)["INPUT0"]
        return list(split_rows(Execution([merged]), [len(m["INPUT0"]) for m in members])), 0, 0

    async def main() -> None:
        batcher = DynamicBatcher(text_format.Parse(config_text, mc.ModelDynamicBatching()), max_batch, 1, execute)
        results = await asyncio.gather(*(batcher.submit(rows(n), ["OUTPUT0"], {}, n) for n in sizes))
        assert [r[0].outputs[0].shape[0] for r in results] == list(sizes)
        batcher.stop()

    asyncio.run(main())
    return formed


def test_batches_fill_up_to_the_limit() -> None:
    # the head run of the queue whose sizes fit in max_batch_size 8; the rest forms the next batch
    assert batch_sizes("", [3, 3, 3, 1]) == [[3, 3], [3, 1]]


def test_preferred_batch_size_cuts_the_batch() -> None:
    assert batch_sizes("preferred_batch_size: [2] max_queue_delay_microseconds: 100000", [1, 1, 1, 1]) == [
        [1, 1], [1, 1]]


def test_queue_delay_lets_a_batch_grow() -> None:
    # a batch that can still grow waits for the delay; the four requests then run together
    assert batch_sizes("max_queue_delay_microseconds: 100000", [1, 1, 1, 1]) == [[1, 1, 1, 1]]


def test_full_queue_is_refused() -> None:
    async def main() -> None:
        running = asyncio.Event()

        async def never(members: list[Feeds], names: Sequence[str], parameters: Mapping[str, Parameter],
                        contexts: Sequence[object]
                        ) -> tuple[list[Execution | Exception], int, int]:
            running.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        batcher = DynamicBatcher(text_format.Parse("default_queue_policy { max_queue_size: 1 }",
                                                   mc.ModelDynamicBatching()), 1, 1, never)
        first = asyncio.ensure_future(batcher.submit(rows(1), [], {}, 1))
        await running.wait()  # the first is taken into a batch that never ends
        second = asyncio.ensure_future(batcher.submit(rows(1), [], {}, 1))
        await asyncio.sleep(0)  # the second runs to its queue place, where it waits for the one instance
        with pytest.raises(Overloaded, match="Exceeds maximum queue size"):
            await batcher.submit(rows(1), [], {}, 1)
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        batcher.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
