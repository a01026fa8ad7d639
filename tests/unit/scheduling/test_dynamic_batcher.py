"""The dynamic batcher (kserve_v2.scheduling.dynamic_batcher): which queued requests form one batch (Triton's
dynamic batcher rules), priority levels and queue policies over its PriorityQueue
(Triton's in scheduler_utils.cc), preserve_ordering and the fast path. Timeouts pass on a clock the tests move,
and every order is set by events, never by sleeping."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter, RequestContext
from kserve_v2.protocol.errors import InvalidInput, Overloaded, Unavailable
from kserve_v2.repository.config import ConfigError, read_config
from kserve_v2.scheduling.batch_rows import merge_rows, row_key, split_rows
from kserve_v2.scheduling.dynamic_batcher import DynamicBatcher, queue_policy_problem
from tests.unit.scheduling.fake_clock import FakeClock

Feeds = dict[str, np.ndarray]


def tagged(tag: int) -> Feeds:
    return {"INPUT0": np.full((1, 2), tag, np.float32)}


class Model:
    """An executor that records the tags of each batch; the first batch waits for ``release``, and a
    batch with a tag in ``held`` waits for that tag's event. ``started`` / ``ended``: set as a tag's
    batch starts / returns."""

    def __init__(self, held: Sequence[int] = ()) -> None:
        self.batches: list[list[int]] = []
        self.running = asyncio.Event()
        self.release = asyncio.Event()
        self.held = {tag: asyncio.Event() for tag in held}
        self.started: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.ended: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)

    async def __call__(self, members: list[Feeds], names: Sequence[str], parameters: Mapping[str, Parameter],
                       contexts: Sequence[object]) -> tuple[list[Execution | Exception], int, int]:
        tags = [int(m["INPUT0"][0, 0]) for m in members]
        self.batches.append(tags)
        if len(self.batches) == 1:
            self.running.set()
            await self.release.wait()
        for tag in tags:
            self.started[tag].set()
            if tag in self.held:
                await self.held[tag].wait()
        for tag in tags:
            self.ended[tag].set()
        merged = merge_rows(members)["INPUT0"]
        return list(split_rows(Execution([merged]), [1] * len(members))), 0, 0


class Arrivals:
    """The batch key (``row_key``), counting the requests that reach the batcher's queue: a test waits
    for them to be queued before it moves the clock."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    def __call__(self, feeds: Feeds, names: Sequence[str], parameters: Mapping[str, Parameter]) -> Hashable:
        self.count += 1
        self.changed.set()
        return row_key(feeds, names, parameters)

    async def reach(self, count: int) -> None:
        while self.count < count:
            self.changed.clear()
            await self.changed.wait()


def batcher(config: str, model: Model, max_batch: int = 1, instances: int = 1, clock: FakeClock | None = None,
            arrivals: Arrivals | None = None) -> DynamicBatcher:
    return DynamicBatcher(text_format.Parse(config, mc.ModelDynamicBatching()), max_batch, instances, model, arrivals,
                          clock=clock or FakeClock())


async def queue_behind_a_running_batch(b: DynamicBatcher, model: Model,
                                       requests: Sequence[tuple[int, Mapping[str, Parameter]]]
                                       ) -> list[asyncio.Future[object]]:
    """Tag 0 runs (and holds the one instance); then ``requests`` (tag, parameters) queue in order
    (tasks start in the order they are made, before the running batch can end)."""
    first = asyncio.ensure_future(b.submit(tagged(0), ["OUTPUT0"], {}, 1))
    await model.running.wait()
    return [first] + [asyncio.ensure_future(b.submit(tagged(tag), ["OUTPUT0"], parameters, 1))
                      for tag, parameters in requests]


def run(main: object) -> None:
    asyncio.run(asyncio.wait_for(main, 10))  # type: ignore[arg-type]


def rows(n: int, width: int = 2, dtype: str = "<f4") -> Feeds:
    return {"INPUT0": np.arange(n * width, dtype=dtype).reshape(n, width)}


def batch_sizes(config_text: str, sizes: Sequence[int], max_batch: int = 8) -> list[list[int]]:
    """Submit requests of ``sizes`` rows at once and record the batches the batcher forms. Each
    execution yields to the loop first, as one on an instance thread does: without a queue delay the
    first request finds the instance free and runs alone at once, and the others queue behind it."""
    formed: list[list[int]] = []

    async def execute(members: list[Feeds], names: Sequence[str], parameters: Mapping[str, Parameter],
                      contexts: Sequence[object]) -> tuple[list[Execution | Exception], int, int]:
        formed.append([len(m["INPUT0"]) for m in members])
        await asyncio.sleep(0)
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
    # the first runs alone on the free instance; then the head run of the queue whose sizes fit in
    # max_batch_size 8, and the rest forms the next batch
    assert batch_sizes("", [1, 3, 3, 3, 1]) == [[1], [3, 3], [3, 1]]


def test_preferred_batch_size_cuts_the_batch() -> None:
    assert batch_sizes("preferred_batch_size: [2] max_queue_delay_microseconds: 100000", [1, 1, 1, 1]) == [
        [1, 1], [1, 1]]


def test_queue_delay_lets_a_batch_grow() -> None:
    # a batch that can still grow waits for the delay; the four requests then run together
    assert batch_sizes("max_queue_delay_microseconds: 100000", [1, 1, 1, 1]) == [[1, 1, 1, 1]]


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


def test_each_level_has_its_own_max_queue_size() -> None:
    async def main() -> None:
        model = Model()
        b = batcher("priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 2 } "
                    "priority_queue_policy { key: 1 value { max_queue_size: 1 } }", model)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"priority": 1}), (2, {}), (3, {}),
                                                              (4, {"priority": 1}), (5, {"priority": 2})])
        refused = calls[4:]
        with pytest.raises(Overloaded, match=r"^\[request id: <id_unknown>\] Exceeds maximum queue size$"):
            await refused[0]
        with pytest.raises(Overloaded, match="Exceeds maximum queue size"):
            await refused[1]
        model.release.set()
        await asyncio.gather(*calls[:4])
        assert model.batches == [[0], [1], [2], [3]]
        b.stop()

    run(main())


def test_reject_fails_a_request_past_its_timeout_with_triton_text() -> None:
    async def main() -> None:
        model, clock, arrivals = Model(), FakeClock(), Arrivals()
        b = batcher("default_queue_policy { default_timeout_microseconds: 1000 }", model, clock=clock, arrivals=arrivals)
        calls = await queue_behind_a_running_batch(b, model, [(1, {})])
        await arrivals.reach(1)  # tag 0 went to the free instance without queueing
        clock.advance(1001)
        with pytest.raises(Unavailable, match="^Request timeout expired$"):
            await calls[1]  # rejected while the instance is still busy
        model.release.set()
        await calls[0]
        assert model.batches == [[0]]
        b.stop()

    run(main())


def test_a_request_timeout_only_shortens_and_only_when_overrides_are_allowed() -> None:
    async def main(override: bool) -> list[bool]:
        model, clock, arrivals = Model(), FakeClock(), Arrivals()
        b = batcher("default_queue_policy { default_timeout_microseconds: 5000000 "
                    f"allow_timeout_override: {str(override).lower()} }}", model, clock=clock, arrivals=arrivals)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"timeout": 20000}), (2, {"timeout": 60_000_000})])
        await arrivals.reach(2)
        clock.advance(300_000)
        model.release.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        b.stop()
        return [isinstance(r, Unavailable) for r in results]

    assert asyncio.run(main(True)) == [False, True, False]
    assert asyncio.run(main(False)) == [False, False, False]


def test_delay_runs_an_expired_request_after_the_unexpired_ones_of_its_level() -> None:
    async def main() -> None:
        model, clock, arrivals = Model(), FakeClock(), Arrivals()
        b = batcher("priority_levels: 2 default_priority_level: 1 default_queue_policy { timeout_action: DELAY "
                    "default_timeout_microseconds: 5000000 allow_timeout_override: true }", model, clock=clock,
                    arrivals=arrivals)
        calls = await queue_behind_a_running_batch(b, model, [(1, {"timeout": 20000}), (2, {}), (3, {"priority": 2})])
        await arrivals.reach(3)
        clock.advance(200_000)  # request 1's timeout passes while it waits
        model.release.set()
        await asyncio.gather(*calls)
        assert model.batches == [[0], [2], [1], [3]]  # delayed behind its level, still ahead of level 2
        b.stop()

    run(main())


def test_preserve_ordering_holds_answers_finished_early() -> None:
    async def main(preserve: bool) -> list[int]:
        model = Model(held=[1])
        model.release.set()
        b = batcher(f"preserve_ordering: {str(preserve).lower()}", model, instances=2)
        finished: list[int] = []

        async def call(tag: int) -> None:
            await b.submit(tagged(tag), ["OUTPUT0"], {}, 1)
            finished.append(tag)

        first = asyncio.ensure_future(call(1))
        await model.started[1].wait()  # 1 runs on one instance until released
        second = asyncio.ensure_future(call(2))
        await model.ended[2].wait()  # 2 ran on the other instance, and ended first
        if not preserve:
            await second  # answered at once
        model.held[1].set()
        await asyncio.gather(first, second)
        b.stop()
        return finished

    assert asyncio.run(asyncio.wait_for(main(False), 10)) == [2, 1]
    assert asyncio.run(asyncio.wait_for(main(True), 10)) == [1, 2]


class FastPool:
    """An instance pool that says whether an execution is tiny (``InstancePool.runs_inline``) as the
    test sets ``tiny``, and counts the requests the batcher runs on its fast path."""

    def __init__(self) -> None:
        self.tiny = False
        self.inline_runs = 0
        self.executable = self

    def runs_inline(self, size: int) -> bool:
        return self.tiny

    def inline(self, work: Callable[[], Execution]) -> tuple[Execution, int, int]:
        self.inline_runs += 1
        return work(), 0, 0

    def execute(self, feeds: Feeds, names: Sequence[str], parameters: Mapping[str, Parameter],
                context: RequestContext) -> Execution:
        return Execution([feeds["INPUT0"]])


def test_preserve_ordering_skips_the_fast_path_while_answers_are_held() -> None:
    async def main() -> tuple[list[int], list[int]]:
        model, pool = Model(held=[1]), FastPool()
        model.release.set()
        b = DynamicBatcher(text_format.Parse("preserve_ordering: true", mc.ModelDynamicBatching()), 1, 2, model,
                           pool=pool, alone=True)  # type: ignore[arg-type]
        finished: list[int] = []

        async def call(tag: int) -> None:
            await b.submit(tagged(tag), ["OUTPUT0"], {}, 1)
            finished.append(tag)

        first = asyncio.ensure_future(call(1))
        await model.started[1].wait()
        pool.tiny = True
        second = asyncio.ensure_future(call(2))  # tiny, an instance free, nothing queued: but 1's answer is held
        await model.ended[2].wait()
        model.held[1].set()
        await asyncio.gather(first, second)
        runs = [pool.inline_runs]
        await call(3)  # no answer held now: the fast path
        b.stop()
        return finished, runs + [pool.inline_runs]

    assert asyncio.run(asyncio.wait_for(main(), 10)) == ([1, 2, 3], [0, 1])


def test_a_lone_request_on_a_free_instance_runs_in_its_own_task_and_its_cancellation_frees_the_instance() -> None:
    async def main() -> None:
        model, arrivals = Model(held=[1]), Arrivals()
        b = batcher("", model, arrivals=arrivals)
        model.release.set()
        assert (await b.submit(tagged(0), ["OUTPUT0"], {}, 1))[0].outputs[0][0, 0] == 0
        # dispatched at once in the caller's task: it never reached the queue or started the batcher's task
        assert arrivals.count == 0 and b._loop_task is None
        held = asyncio.ensure_future(b.submit(tagged(1), ["OUTPUT0"], {}, 1))
        await model.started[1].wait()
        waiting = asyncio.ensure_future(b.submit(tagged(2), ["OUTPUT0"], {}, 1))
        await arrivals.reach(1)  # the instance is busy: this one queues
        held.cancel()  # the caller goes away: its execution is stopped and the instance is free again
        with pytest.raises(asyncio.CancelledError):
            await held
        assert not model.ended[1].is_set()
        await waiting
        assert model.batches == [[0], [1], [2]]
        b.stop()

    run(main())


def test_a_bad_priority_or_timeout_parameter_is_refused() -> None:
    async def main() -> None:
        b = batcher("", Model())
        with pytest.raises(InvalidInput, match=r"^invalid value for 'priority', expected value >= 0\.$"):
            await b.submit(tagged(1), ["OUTPUT0"], {"priority": -1}, 1)
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
