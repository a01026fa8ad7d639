"""InstancePool (kserve_v2.scheduling.instances): ``on_each`` makes one run on each instance thread, all at
once, as a version's warmup runs its samples on every instance before it serves; ``run`` chooses
between the event loop and the instance threads by the work's CPU time measured on the loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from kserve_v2.backend import BatchStrategy, Execution, Parameter
from kserve_v2.backend.text import TextContract
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.scheduling.instances import PROBE_EVERY, InstancePool


class Idle:
    """An executable that is never executed here (on_each runs the work it is given)."""

    inputs: tuple[TensorDeclaration, ...] = ()
    outputs: tuple[TensorDeclaration, ...] = ()
    on_cuda = False
    batchable = False
    threaded = False
    batching: BatchStrategy | None = None
    text: TextContract | None = None

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: object = None) -> Execution:
        raise AssertionError("not executed")

    def close(self) -> None:
        pass


def test_one_run_per_instance_thread_at_once() -> None:
    pool = InstancePool("m", 1, 3, Idle())
    inside = threading.Barrier(3, timeout=10)  # passes only if the three runs overlap
    try:
        names = pool.on_each(lambda: (inside.wait(), threading.current_thread().name)[1])
        assert len(names) == 3 and len(set(names)) == 3, names
        assert pool.on_each(lambda: 7) == [7, 7, 7]
    finally:
        pool.close()


def test_a_failing_run_raises_once_every_run_has_ended() -> None:
    pool = InstancePool("m", 1, 2, Idle())
    ended: list[str] = []
    failed, returned = threading.Event(), threading.Event()

    def work() -> None:
        if threading.current_thread().name.endswith("_0"):
            failed.set()
            raise ValueError("boom")
        failed.wait(10)  # the other run fails first
        returned.wait(0.2)  # a pool that answered at the failure returns meanwhile (and is caught below)
        ended.append("slow")

    try:
        with pytest.raises(ValueError, match="boom"):
            pool.on_each(work)
        seen = list(ended)
        returned.set()
        assert seen == ["slow"]
    finally:
        pool.close()


def _burn(cpu_ns: int) -> None:
    end = time.thread_time_ns() + cpu_ns
    while time.thread_time_ns() < end:
        pass


def _where_runs_go(thread_cost_ns: int, loop_cost_ns: int, runs: int) -> list[bool]:
    """Whether each of ``runs`` executions ran on the event loop, for work whose CPU time reads
    ``thread_cost_ns`` on an instance thread and ``loop_cost_ns`` on the loop."""
    pool = InstancePool("m", 1, 1, Idle())

    async def drive() -> list[bool]:
        loop_thread = threading.current_thread()

        def work() -> bool:
            on_loop = threading.current_thread() is loop_thread
            _burn(loop_cost_ns if on_loop else thread_cost_ns)
            return on_loop

        return [(await pool.run(work, 64))[0] for _ in range(runs)]

    try:
        return asyncio.run(drive())
    finally:
        pool.close()


def test_work_that_reads_dear_only_on_threads_moves_to_the_loop() -> None:
    # the GIL held by a busy loop inflates a thread's reading of a few microseconds of work past INLINE_NS
    assert _where_runs_go(thread_cost_ns=300_000, loop_cost_ns=5_000, runs=5) == [False, True, True, True, True]


def test_work_dear_on_the_loop_too_stays_on_threads_but_for_a_probe_now_and_then() -> None:
    where = _where_runs_go(thread_cost_ns=300_000, loop_cost_ns=300_000, runs=PROBE_EVERY + 3)
    assert [i for i, on_loop in enumerate(where) if on_loop] == [1, PROBE_EVERY + 2]


def test_work_dear_on_threads_beyond_the_probe_limit_is_never_tried_on_the_loop() -> None:
    assert _where_runs_go(thread_cost_ns=1_500_000, loop_cost_ns=5_000, runs=4) == [False] * 4
