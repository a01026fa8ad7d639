"""The dynamic batcher's priority queue (kserve_v2.scheduling.priority_queue; Triton's PriorityQueue and
PolicyQueue in its core's scheduler_utils.cc): levels, per-level policies (max_queue_size, REJECT,
DELAY, timeouts and their override), one size and the pending batch's cursor, on a clock the tests move."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import RequestContext
from kserve_v2.protocol.errors import InvalidInput, Overloaded, Unavailable
from kserve_v2.scheduling.base import DynamicRequest
from kserve_v2.scheduling.priority_queue import PriorityQueue, request_priority, request_timeout_us
from tests.unit.scheduling.fake_clock import FakeClock


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


def queue(config: str, clock: FakeClock | None = None) -> PriorityQueue:
    return PriorityQueue(text_format.Parse(config, mc.ModelDynamicBatching()), clock or FakeClock())


def request(q: PriorityQueue, tag: int, priority: int = 0, timeout_us: int = 0, request_id: str = "") -> DynamicRequest:
    """Request ``tag`` queued now (its outcome: a future of the running loop)."""
    made = DynamicRequest({"INPUT0": np.full((1, 1), tag)}, ["OUTPUT0"], {}, "key", q.clock(),
                          asyncio.get_running_loop().create_future(), RequestContext(request_id))
    q.enqueue(made, priority, timeout_us)
    return made


def tags(requests: list[DynamicRequest]) -> list[int]:
    return [int(r.feeds["INPUT0"][0, 0]) for r in requests]


def test_levels_run_highest_first_and_zero_or_out_of_range_is_the_default_level() -> None:
    async def test() -> None:
        q = queue("priority_levels: 3 default_priority_level: 2")
        made = [request(q, 1, 3), request(q, 2, 0), request(q, 3), request(q, 4, 99), request(q, 5, 1)]
        assert [r.priority for r in made] == [3, 2, 2, 2, 1]
        assert len(q) == 5
        assert tags(q.dequeue(5)) == [5, 2, 3, 4, 1] and len(q) == 0

    run(test)


def test_without_priority_levels_the_queue_is_one_fifo() -> None:
    async def test() -> None:
        q = queue("")
        for tag, priority in ((1, 5), (2, 1), (3, 0)):
            request(q, tag, priority)
        assert tags(q.dequeue(3)) == [1, 2, 3]

    run(test)


def test_each_level_has_its_own_max_queue_size() -> None:
    async def test() -> None:
        q = queue("priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 2 } "
                  "priority_queue_policy { key: 1 value { max_queue_size: 1 } }")
        request(q, 1, 1)
        with pytest.raises(Overloaded, match=r"^\[request id: r7\] Exceeds maximum queue size$"):
            request(q, 2, 1, request_id="r7")
        request(q, 3)
        request(q, 4)
        with pytest.raises(Overloaded, match=r"^\[request id: <id_unknown>\] Exceeds maximum queue size$"):
            request(q, 5)
        assert len(q) == 3
        q.dequeue(1)
        request(q, 6, 1)  # room again at level 1
        assert tags(q.dequeue(3)) == [6, 3, 4]

    run(test)


def test_a_request_timeout_only_shortens_the_policy_and_only_when_overrides_are_allowed() -> None:
    async def test() -> None:
        clock = FakeClock()
        allowed = queue("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 "
                        "allow_timeout_override: true }", clock)
        fixed = queue("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 }", clock)
        never = queue("default_queue_policy { allow_timeout_override: true }", clock)
        deadlines = [request(allowed, 1, timeout_us=20).deadline_ns, request(allowed, 2, timeout_us=9000).deadline_ns,
                     request(allowed, 3).deadline_ns, request(fixed, 4, timeout_us=20).deadline_ns,
                     request(never, 5, timeout_us=20).deadline_ns]
        now = clock()
        assert deadlines == [now + 20_000, now + 5_000_000, now + 5_000_000, now + 5_000_000, 0]

    run(test)


def test_reject_fails_requests_past_their_timeout_with_triton_text() -> None:
    async def test() -> None:
        clock = FakeClock()
        q = queue("default_queue_policy { default_timeout_microseconds: 100 allow_timeout_override: true }", clock)
        first, second, third = request(q, 1), request(q, 2, timeout_us=10), request(q, 3)
        clock.advance(10)
        q.apply_policies()  # at the deadline, not yet past it
        assert len(q) == 3 and not second.future.done()
        clock.advance(1)
        q.expire()  # wherever it waits: here behind the first
        assert len(q) == 2 and not first.future.done()
        with pytest.raises(Unavailable, match="^Request timeout expired$"):
            second.future.result()
        clock.advance(100)
        q.apply_policies()
        assert len(q) == 0 and isinstance(first.future.exception(), Unavailable)
        assert isinstance(third.future.exception(), Unavailable)

    run(test)


def test_reject_fails_a_request_at_its_timeout_without_being_asked() -> None:
    async def test() -> None:
        clock = FakeClock()
        q = queue("default_queue_policy { default_timeout_microseconds: 1 }", clock)
        waiting, later = request(q, 1), request(q, 2, timeout_us=0)
        clock.advance(2)
        with pytest.raises(Unavailable, match="^Request timeout expired$"):
            await waiting.future  # the queue's own timer
        with pytest.raises(Unavailable):
            await later.future
        assert len(q) == 0
        q.close()

    run(test)


def test_delay_moves_an_expired_request_behind_its_level_where_it_still_runs() -> None:
    async def test() -> None:
        clock = FakeClock()
        q = queue("priority_levels: 2 default_priority_level: 1 default_queue_policy { timeout_action: DELAY "
                  "default_timeout_microseconds: 5000 allow_timeout_override: true }", clock)
        for tag, priority, timeout_us in ((1, 0, 20), (2, 0, 0), (3, 2, 0)):
            request(q, tag, priority, timeout_us)
        clock.advance(21)
        q.apply_policies()
        q.expire()  # DELAY: nothing to fail
        assert len(q) == 3
        assert tags(q.dequeue(3)) == [2, 1, 3]

    run(test)


def test_requests_that_have_their_outcome_leave_the_queue() -> None:
    async def test() -> None:
        q = queue("")
        first, second, third = request(q, 1), request(q, 2), request(q, 3)
        assert q.remove(second) and not q.remove(second)
        first.future.cancel()
        q.apply_policies()
        assert len(q) == 1 and tags(q.dequeue(2)) == [3]
        assert not q.remove(third)  # taken: no longer waiting

    run(test)


def test_the_cursor_grows_the_pending_batch_across_levels() -> None:
    async def test() -> None:
        clock = FakeClock()
        q = queue("priority_levels: 2 default_priority_level: 2 default_queue_policy { timeout_action: DELAY "
                  "default_timeout_microseconds: 1000 allow_timeout_override: true }", clock)
        request(q, 1, timeout_us=10)
        clock.advance(5)
        request(q, 2, timeout_us=400)
        request(q, 3, 1, timeout_us=600)
        clock.advance(6)
        q.apply_policies()  # 1 is past its timeout: behind 2 at level 2
        q.reset_cursor()
        walked = []
        while (at := q.at_cursor()) is not None:
            walked.append(tags([at])[0])
            q.advance_cursor()
            if q.pending_count == 2:
                assert q.oldest_enqueued_ns == clock() - 6000  # 3 and 2, queued together
                assert q.closest_timeout_ns == q.oldest_enqueued_ns + 400_000
        assert walked == [3, 2, 1] and q.pending_count == 3
        assert q.oldest_enqueued_ns == clock() - 11_000  # the delayed 1 is the oldest
        assert q.closest_timeout_ns == clock() - 6000 + 400_000  # past timeouts no longer count
        q.advance_cursor()  # at the end: no effect
        assert q.pending_count == 3
        assert tags(q.dequeue(2)) == [3, 2] and q.pending_count == 0  # the cursor is back at the head
        assert q.at_cursor() is not None and tags(q.dequeue(1)) == [1]

    run(test)


def test_bad_priority_and_timeout_parameters_are_invalid() -> None:
    assert (request_priority({}), request_priority({"priority": 3}), request_timeout_us({"timeout": 7})) == (0, 3, 7)
    with pytest.raises(InvalidInput, match=r"^invalid value for 'priority', expected value >= 0\.$"):
        request_priority({"priority": -1})
    with pytest.raises(InvalidInput, match="invalid value type for 'priority' parameter"):
        request_priority({"priority": True})
    with pytest.raises(InvalidInput, match=r"invalid value type for 'timeout' parameter, expected int64_param\."):
        request_timeout_us({"timeout": 1.5})
