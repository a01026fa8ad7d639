"""A loaded, servable model version: its configuration, backend executable, executor and statistics.

Executions run on a thread pool sized by the instance group count, so ORT never blocks the
event loop and at most ``count`` executions of a version run at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Executable, Execution, Parameter
from kserve_v2.spec import ModelSpec
from kserve_v2.statistics import ModelStats


class ModelVersion:
    """One READY version of a model.

    Attributes:
        name, version: identity (version > 0).
        config: the completed ModelConfig served by the ModelConfig RPC.
        spec: tensor interface used for validation and metadata.
        stats: Triton-style counters.
        inflight: requests currently using this version (unload drains them).
    """

    def __init__(self, name: str, version: int, config: mc.ModelConfig, executable: Executable) -> None:
        self.name = name
        self.version = version
        self.config = config
        self.spec = ModelSpec.from_config(config)
        self.stats = ModelStats()
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._executable = executable
        self.on_gpu = executable.on_cuda
        instances = sum(g.count for g in config.instance_group) or 1
        self._executor = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"ort-{name}-{version}")

    async def run(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                  parameters: Mapping[str, Parameter]) -> tuple[Execution, int, int]:
        """Execute off the event loop.

        Args:
            feeds: input name -> array in the model's shape.
            output_names: outputs to return, in order.
            parameters: the request's parameters, for backends that take options.

        Returns:
            (execution, queue_ns, infer_ns): queue_ns is the wait for a free instance; infer_ns
            is the model's own time (the execution's pre and post time taken out).
        """
        submitted = time.perf_counter_ns()
        started = 0

        def execute() -> Execution:
            nonlocal started
            started = time.perf_counter_ns()
            return self._executable.execute(feeds, output_names, parameters)

        execution = await asyncio.get_running_loop().run_in_executor(self._executor, execute)
        finished = time.perf_counter_ns()
        return execution, started - submitted, finished - started - execution.pre_ns - execution.post_ns

    def hold(self) -> None:
        """A request starts using this version (event loop only)."""
        self.inflight += 1
        self._idle.clear()

    def release(self) -> None:
        """A request is done with this version (event loop only)."""
        self.inflight -= 1
        if not self.inflight:
            self._idle.set()

    async def drained(self) -> None:
        """Wait until no request uses this version."""
        await self._idle.wait()

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking)."""
        self._executor.shutdown(wait=True)
        del self._executable
