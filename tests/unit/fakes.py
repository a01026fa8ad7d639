"""Fakes of the core's seams that the unit layer shares: an ``Executable`` of our own backend protocol
(``kserve_v2.backend``), so a scheduler, a version or the service runs without ONNX Runtime."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from kserve_v2.backend import BatchStrategy, Execution, Parameter
from kserve_v2.backend.text import TextContract
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.protocol.model_spec import TensorDeclaration

Behaviour = Callable[[dict[str, np.ndarray], Sequence[str]], Execution]


class Doubling:
    """An executable whose one output is twice its one input: ``OUTPUT0 = 2 * INPUT0``, declared as
    FP32 [-1, 2] (any datatype runs).

    Args:
        behaviour: (feeds, output names) -> the execution, run instead of the doubling.
        failure: when set, every execution raises ``ValueError(failure)``.

    Attributes:
        calls: (thread name, feeds) of every execution, in the order they ran.
        closed: whether ``close`` was called.
    """

    inputs = (TensorDeclaration("INPUT0", BY_V2["FP32"], (-1, 2)),)
    outputs = (TensorDeclaration("OUTPUT0", BY_V2["FP32"], (-1, 2)),)
    on_cuda = False
    batchable = True
    threaded = False
    batching: BatchStrategy | None = None
    text: TextContract | None = None

    def __init__(self, behaviour: Behaviour | None = None, failure: str = "") -> None:
        self.behaviour = behaviour
        self.failure = failure
        self.calls: list[tuple[str, dict[str, np.ndarray]]] = []
        self.closed = False
        self._lock = threading.Lock()

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: object = None) -> Execution:
        """Record the call, then fail, run ``behaviour``, or double INPUT0."""
        with self._lock:
            self.calls.append((threading.current_thread().name, feeds))
        if self.failure:
            raise ValueError(self.failure)
        if self.behaviour is not None:
            return self.behaviour(feeds, output_names)
        return Execution([feeds["INPUT0"] * 2])

    def close(self) -> None:
        """Mark the executable closed."""
        self.closed = True
