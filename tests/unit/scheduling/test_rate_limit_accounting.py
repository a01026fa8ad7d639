"""The rate limiter's resource accounting and order (kserve_v2.scheduling.rate_limiter, Triton's rate_limiter.cc)."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.scheduling.rate_limiter import GLOBAL, ModelInstances, RateLimiter, RateLimitError
from kserve_v2.settings.rate_limit import EVERY_DEVICE, RateLimitResource, parse_rate_limit_resource


def groups(text: str) -> list[mc.ModelInstanceGroup]:
    return list(text_format.Parse(text, mc.ModelConfig()).instance_group)


ONE_R = groups('instance_group [{ count: 1 kind: KIND_CPU rate_limiter { resources [{ name: "R" count: 1 }] } }]')


def test_parse_resource_flag() -> None:
    assert parse_rate_limit_resource("R1:10") == RateLimitResource("R1", 10, EVERY_DEVICE)
    assert parse_rate_limit_resource("R2:5:1") == RateLimitResource("R2", 5, 1)
    for bad in ("R1", "R1:x", "R1:1:2:3", ":4", "R:-1"):
        with pytest.raises(ValueError, match="--rate-limit-resource option format is"):
            parse_rate_limit_resource(bad)


def test_default_copies_are_the_most_an_instance_needs() -> None:
    limiter = RateLimiter()
    limiter.register(groups('instance_group [{ count: 1 kind: KIND_CPU rate_limiter { resources [{ name: "R1" count: 4 }, '
                            '{ name: "R2" count: 4 }] } }]'))
    limiter.register(groups('instance_group [{ count: 1 kind: KIND_CPU rate_limiter { resources [{ name: "R2" count: 5 }, '
                            '{ name: "G" count: 3 global: true }] } }]'))
    assert limiter.limits() == {(0, "R1"): 4, (0, "R2"): 5, (GLOBAL, "G"): 3}


def test_explicit_copies_and_their_refusals() -> None:
    limiter = RateLimiter([RateLimitResource("R", 2), RateLimitResource("R", 3, 0)])
    limiter.register(ONE_R)
    assert limiter.limits() == {(0, "R"): 3}
    with pytest.raises(RateLimitError, match='Resource count for "S" is limited to 0 which will prevent scheduling'):
        limiter.register(groups('instance_group [{ count: 1 rate_limiter { resources [{ name: "S" count: 1 }] } }]'))
    assert limiter.limits() == {(0, "R"): 3}  # the refused version left nothing behind
    with pytest.raises(RateLimitError, match='Resource "R" is present as both global and device-specific resource'):
        RateLimiter().register(groups('instance_group [{ count: 1 rate_limiter { resources [{ name: "R" count: 1 }] } }, '
                                      '{ count: 1 rate_limiter { resources [{ name: "R" count: 1 global: true }] } }]'))


def test_instances_sharing_one_copy_run_one_at_a_time() -> None:
    async def scenario() -> list[str]:
        limiter = RateLimiter()
        a, b = limiter.register(ONE_R), limiter.register(ONE_R)
        events: list[str] = []

        async def execute(model: ModelInstances, label: str) -> None:
            instance = await model.acquire()
            events.append(f"start {label}")
            await asyncio.sleep(0)  # the others try to acquire meanwhile
            events.append(f"end {label}")
            model.release(instance)

        await asyncio.gather(execute(a, "a1"), execute(b, "b1"), execute(a, "a2"))
        return events

    events = asyncio.run(scenario())
    assert events == ["start a1", "end a1", "start b1", "end b1", "start a2", "end a2"]


def test_priority_weights_turns() -> None:
    """Priority 2 gets half the turns of priority 1 (executions x priority, lowest first)."""
    async def scenario() -> list[str]:
        limiter = RateLimiter()
        fast = limiter.register(groups('instance_group [{ count: 1 rate_limiter { resources [{ name: "R" count: 1 }] '
                                       'priority: 1 } }]'))
        slow = limiter.register(groups('instance_group [{ count: 1 rate_limiter { resources [{ name: "R" count: 1 }] '
                                       'priority: 2 } }]'))
        blocker = await fast.acquire()  # hold R while both queue up
        order: list[str] = []

        async def execute(model: ModelInstances, label: str) -> None:
            instance = await model.acquire()
            order.append(label)
            await asyncio.sleep(0)
            model.release(instance)

        tasks = [asyncio.create_task(execute(model, label)) for _ in range(12)
                 for model, label in ((fast, "p1"), (slow, "p2"))]  # both always have a request waiting
        asyncio.get_running_loop().call_soon(fast.release, blocker)  # once every task waits (they start first)
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(scenario())
    assert order[3:18] == ["p1", "p1", "p2"] * 5  # once both have executed: two turns of p1 for one of p2


def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def scenario() -> bool:
        limiter = RateLimiter()
        a, b = limiter.register(ONE_R), limiter.register(ONE_R)
        held = await a.acquire()
        waiting = asyncio.create_task(b.acquire())
        asyncio.get_running_loop().call_soon(waiting.cancel)  # once it waits (it starts first)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        a.release(held)
        got = await asyncio.wait_for(b.acquire(), 1)
        b.release(got)
        return True

    assert asyncio.run(scenario())
