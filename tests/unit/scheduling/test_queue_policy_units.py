"""The dynamic batcher's priority levels, queue policies and preserve_ordering
(kserve_v2.scheduling.dynamic_batcher; Triton's PriorityQueue in scheduler_utils.cc)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter
from kserve_v2.protocol.errors import InvalidInput, Overloaded, Unavailable
from kserve_v2.repository.config import ConfigError, read_config
from kserve_v2.scheduling.dynamic_batcher import DynamicBatcher, merge_rows, queue_policy_problem, row_key, split_rows

Feeds = dict[str, np.ndarray]


def tagged(tag: int) -> Feeds:
    return {"INPUT0": np.full((1, 2), tag, np.float32)}


class Model:
    """An executor that records the tags of each batch; the first batch waits for ``release``."""

    def __init__(self, slow: dict[int, float] | None = None) -> None:
        self.batches: list[list[int]] = []
        self.running = asyncio.Event()
        self.release = asyncio.Event()
        self.slow = slow or {}

    async def __call__(self, members: list[Feeds], names: Sequence[str], parameters: Mapping[str, Parameter],
                       contexts: Sequence[object]) -> tuple[list[Execution | Exception], int, int]:
        tags = [int(m["INPUT0"][0, 0]) for m in members]
        self.batches.append(tags)
        if len(self.batches) == 1:
            self.running.set()
            await self.release.wait()
        await asyncio.sleep(max(self.slow.get(t, 0.0) for t in tags))
        merged = merge_rows(members)["INPUT0"]
        return list(split_rows(Execution([merged]), [1] * len(members))), 0, 0


def batcher(config: str, model: Model, max_batch: int = 1, instances: int = 1) -> DynamicBatcher:
    return DynamicBatcher(text_format.Parse(config, mc.ModelDynamicBatching()), max_batch, instances, model)


async def queue_behind_a_running_batch(b: DynamicBatcher, model: Model,
                                       requests: Sequence[tuple[int, Mapping[str, Parameter]]]
                                       ) -> list[asyncio.Future[object]]:
    """Tag 0 runs (and holds the one instance); then ``requests`` (tag, parameters) queue in order."""
    first = asyncio.ensure_future(b.submit(tagged(0), ["OUTPUT0"], {}, 1))
    await model.running.wait()
    calls: list[asyncio.Future[object]] = [first]
    for tag, parameters in requests:
        calls.append(asyncio.ensure_future(b.submit(tagged(tag), ["OUTPUT0"], parameters, 1)))
        await asyncio.sleep(0)  # queued in this order
    return calls


def run(main: object) -> None:
    asyncio.run(asyncio.wait_for(main, 10))  # type: ignore[arg-type]


def test_a_higher_priority_overtakes_and_zero_or_out_of_range_means_the_default_level() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("priority_levels: 3 default_priority_level: 2", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"priority": 3}), (2, {"priority": 0}),
                                                              (3, {}), (4, {"priority": 99}), (5, {"priority": 1})])
        model.release.set()
        await asyncio.gather(*calls)
        assert model.batches == [[0], [5], [2], [3], [4], [1]]
        b.stop()

    run(main())


def test_levels_without_priority_levels_are_one_fifo() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"priority": 5}), (2, {"priority": 1})])
        model.release.set()
        await asyncio.gather(*calls)
        assert model.batches == [[0], [1], [2]]
        b.stop()

    run(main())


def test_a_batch_spans_levels_and_reserved_parameters_stay_out_of_the_key() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("priority_levels: 2 default_priority_level: 2", model, max_batch=4)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"priority": 2, "timeout": 5_000_000}),
                                                              (2, {"priority": 1, "sequence_id": 7})])
        model.release.set()
        await asyncio.gather(*calls)
        assert model.batches == [[0], [2, 1]]
        b.stop()

    run(main())
    assert row_key(tagged(1), ["OUTPUT0"], {"priority": 1, "timeout": 9}) == row_key(tagged(2), ["OUTPUT0"], {})
    assert row_key(tagged(1), ["OUTPUT0"], {"mine": 1}) != row_key(tagged(2), ["OUTPUT0"], {})


def test_each_level_has_its_own_max_queue_size() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 2 } "
                    "priority_queue_policy { key: 1 value { max_queue_size: 1 } }", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"priority": 1}), (2, {}), (3, {})])
        with pytest.raises(Overloaded, match=r"^\[request id: <id_unknown>\] Exceeds maximum queue size$"):
            await b.submit(tagged(4), ["OUTPUT0"], {"priority": 1}, 1)
        with pytest.raises(Overloaded, match="Exceeds maximum queue size"):
            await b.submit(tagged(5), ["OUTPUT0"], {"priority": 2}, 1)
        model.release.set()
        await asyncio.gather(*calls)
        assert model.batches == [[0], [1], [2], [3]]
        b.stop()

    run(main())


def test_reject_fails_a_request_past_its_timeout_with_triton_text() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("default_queue_policy { default_timeout_microseconds: 50000 }", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {})])
        with pytest.raises(Unavailable, match="^Request timeout expired$"):
            await calls[1]  # rejected while the instance is still busy
        model.release.set()
        await calls[0]
        assert model.batches == [[0]]
        b.stop()

    run(main())


def test_a_request_timeout_only_shortens_and_only_when_overrides_are_allowed() -> None:
    async def main(override: bool) -> list[bool]:
        model = Model()
        b = batcher("default_queue_policy { default_timeout_microseconds: 5000000 "
                    f"allow_timeout_override: {str(override).lower()} }}", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"timeout": 20000}), (2, {"timeout": 60_000_000})])
        await asyncio.sleep(0.3)
        model.release.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        b.stop()
        return [isinstance(r, Unavailable) for r in results]

    assert asyncio.run(main(True)) == [False, True, False]
    assert asyncio.run(main(False)) == [False, False, False]


def test_delay_runs_an_expired_request_after_the_unexpired_ones_of_its_level() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("priority_levels: 2 default_priority_level: 1 default_queue_policy { timeout_action: DELAY "
                    "default_timeout_microseconds: 5000000 allow_timeout_override: true }", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"timeout": 20000}), (2, {}), (3, {"priority": 2})])
        await asyncio.sleep(0.2)  # request 1's timeout passes while it waits
        model.release.set()
        await asyncio.gather(*calls)
        assert model.batches == [[0], [2], [1], [3]]  # delayed behind its level, still ahead of level 2
        b.stop()

    run(main())


def test_preserve_ordering_holds_answers_finished_early() -> None:
    async def main(preserve: bool) -> list[int]:
        model = Model(slow={1: 0.3})
        model.release.set()
        b = batcher(f"preserve_ordering: {str(preserve).lower()}", model, instances=2)
        finished: list[int] = []

        async def call(tag: int) -> None:
            await b.submit(tagged(tag), ["OUTPUT0"], {}, 1)
            finished.append(tag)

        first = asyncio.ensure_future(call(1))
        await asyncio.sleep(0.05)  # 1 runs on one instance for 0.3 s
        await asyncio.gather(first, call(2))
        b.stop()
        return finished

    assert asyncio.run(main(False)) == [2, 1]
    assert asyncio.run(main(True)) == [1, 2]


def test_preserve_ordering_skips_the_fast_path_while_answers_are_held() -> None:
    async def main() -> float:
        model = Model(slow={1: 0.3})
        model.release.set()
        b = batcher("preserve_ordering: true", model, instances=2)
        start = time.perf_counter()
        first = asyncio.ensure_future(b.submit(tagged(1), ["OUTPUT0"], {}, 1))
        await asyncio.sleep(0.05)
        await b.submit(tagged(2), ["OUTPUT0"], {}, 1)
        elapsed = time.perf_counter() - start
        await first
        b.stop()
        return elapsed

    assert asyncio.run(main()) >= 0.25  # the second answer waited for the first


def test_bad_priority_and_timeout_parameters_are_invalid() -> None:
    async def main() -> None:
        b = batcher("", Model())
        with pytest.raises(InvalidInput, match=r"^invalid value for 'priority', expected value >= 0\.$"):
            await b.submit(tagged(1), ["OUTPUT0"], {"priority": -1}, 1)
        with pytest.raises(InvalidInput, match="invalid value type for 'priority' parameter"):
            await b.submit(tagged(1), ["OUTPUT0"], {"priority": "high"}, 1)
        with pytest.raises(InvalidInput, match=r"invalid value type for 'timeout' parameter, expected int64_param\."):
            await b.submit(tagged(1), ["OUTPUT0"], {"timeout": 1.5}, 1)
        b.stop()

    run(main())


@pytest.mark.parametrize(("text", "problem"), [
    ("priority_levels: 2", "default priority level must be in range [1, 2] for m"),
    ("priority_levels: 2 default_priority_level: 3", "default priority level must be in range [1, 2] for m"),
    ("priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value {} }",
     "priority queue policy must have priority level in range [1, 2] for m"),
    ("priority_levels: 2 default_priority_level: 1 preserve_ordering: true",
     "Only one priority level is allowed when 'preserve_ordering' is true for m"),
    ("preserve_ordering: true default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1 }",
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
    ("priority_levels: 1 default_priority_level: 1 preserve_ordering: true "
     "default_queue_policy { timeout_action: DELAY }", None),
])
def test_queue_policy_problems_are_triton_load_errors(text: str, problem: str | None) -> None:
    config = mc.ModelConfig(name="m", dynamic_batching=text_format.Parse(text, mc.ModelDynamicBatching()))
    assert queue_policy_problem(config) == problem


def test_a_config_with_a_bad_priority_level_fails_to_load(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ndynamic_batching { priority_levels: 2 }\n')
    with pytest.raises(ConfigError, match=r"^default priority level must be in range \[1, 2\] for m$"):
        read_config(tmp_path / "m", "m")
