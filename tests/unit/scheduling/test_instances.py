"""InstancePool.on_each (kserve_v2.scheduling.instances): one run on each instance thread, all at once,
as a version's warmup runs its samples on every instance before it serves."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from kserve_v2.backend import BatchStrategy, Execution, Parameter
from kserve_v2.backend.text import TextContract
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.scheduling.instances import InstancePool


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
