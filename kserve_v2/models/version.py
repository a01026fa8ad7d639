"""A loaded, servable model version, and the scheduler its configuration picks.

A version is its identity, its configuration and tensor interface, its statistics, the requests
using it, and its ``Scheduler`` (``kserve_v2.scheduling.base``), which runs its requests. The scheduler
is picked once, when the version loads, from the configuration's ``scheduling_choice`` (one of
``dynamic_batching``, ``sequence_batching`` and ``ensemble_scheduling``: a configuration with two
of them does not parse), as Triton's ``TritonModel::SetConfiguredScheduler`` picks it:
``sequence_batching`` -> ``SequenceBatcher``; ``dynamic_batching`` with a batch limit -> the
``DynamicBatcher``, merging as the backend's ``BatchStrategy`` says (rows along dim 0 with
``max_batch_size > 0``, or a text backend's texts); otherwise -> ``DirectScheduler``. An
ensemble's ``EnsembleScheduler`` is built by the model manager once its steps are loaded. A version
is warmed up (``model_warmup``, ``kserve_v2.models.warmup``) before it is handed out to serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Executable
from kserve_v2.backend.host import RateLimiting
from kserve_v2.backend.instance_groups import instance_count
from kserve_v2.backend.text import TextContract
from kserve_v2.models.warmup import warm_up
from kserve_v2.protocol.model_spec import ModelSpec
from kserve_v2.protocol.statistics import ModelStats
from kserve_v2.scheduling.base import DirectScheduler, Scheduler
from kserve_v2.scheduling.dynamic_batcher import DynamicBatcher, RowBatching, batch_executor
from kserve_v2.scheduling.instances import InstancePool
from kserve_v2.scheduling.ragged import wrap as ragged
from kserve_v2.scheduling.sequence_batcher import SequenceBatcher
from kserve_v2.scheduling.sequence_config import SequenceSettings


class ModelVersion:
    """One READY version of a model.

    Attributes:
        name, version: identity (version > 0); label: the version as text (metric labels, responses).
        config: the completed ModelConfig served by the ModelConfig RPC.
        spec: tensor interface used for validation and metadata.
        stats: Triton-style counters.
        inflight: requests currently using this version (unload drains them).
        scheduler: runs the version's requests.
        text: the text contract of its backend (``kserve_v2.backend.text``); None for a tensor model.
        on_gpu: whether it runs on the CUDA execution provider.
        decoupled: whether it may answer a request with zero or many responses
            (``model_transaction_policy { decoupled: true }``, ``kserve_v2.backend.decoupled``).
    """

    def __init__(self, name: str, version: int, config: mc.ModelConfig, scheduler: Scheduler,
                 labels: Mapping[str, tuple[str, ...]] | None = None, text: TextContract | None = None,
                 on_gpu: bool = False) -> None:
        self.name = name
        self.version = version
        self.label = str(version)
        self.config = config
        self.spec = ModelSpec.from_config(config, labels)
        self.stats = ModelStats()
        self.inflight = 0
        self.scheduler = scheduler
        self.text = text
        self.on_gpu = on_gpu
        self.decoupled = config.model_transaction_policy.decoupled
        self._idle = asyncio.Event()
        self._idle.set()

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
        """Wait until no request uses this version, then stop its scheduler (event loop only)."""
        await self._idle.wait()
        self.scheduler.stop()

    def close(self) -> None:
        """Wait for running executions and release the backend (blocking)."""
        self.scheduler.close()


def open_version(name: str, version: int, config: mc.ModelConfig, executable: Executable,
                 sequence: SequenceSettings | None = None,
                 labels: Mapping[str, tuple[str, ...]] | None = None, model_dir: Path | None = None,
                 rate_limiter: RateLimiting | None = None) -> ModelVersion:
    """A version of a model its backend opened, with the scheduler its configuration picks (see the
    module docstring) and its instances (the instance group count), warmed up: each instance has run
    the configuration's ``model_warmup`` samples (``kserve_v2.models.warmup``), counted in its statistics.

    Args:
        name, version, config: the version and its completed configuration.
        executable: what the backend opened.
        sequence: the checked ``sequence_batching`` settings, given when the configuration has them.
        labels: output name -> labels (``label_filename``), for classification.
        model_dir: the model's folder, where warmup data files are read (``warmup/``); None: no warmup.
        rate_limiter: the server's rate limiter its instances register with (``BackendHost.rate_limiter``);
            None: rate limiting is off.

    Raises:
        RateLimitError: the instance groups' ``rate_limiter`` resources cannot be granted (Triton's text).
        WarmupError: a warmup sample that cannot be built or fails; the version is closed (the
            message is its load failure reason, Triton's text).
    """
    executable = ragged(config, executable)  # allow_ragged_batch, batch_input, batch_output
    pool = InstancePool(name, version, instance_count(config.instance_group) or 1, executable,
                        config.instance_group, rate_limiter)
    strategy = executable.batching or RowBatching(executable)
    scheduler: Scheduler
    if sequence is not None:
        scheduler = SequenceBatcher(sequence, pool.count, batch_executor(pool, strategy), pool)
    elif config.HasField("dynamic_batching") and (limit := strategy.limit(config)) > 0:
        scheduler = DynamicBatcher(config.dynamic_batching, limit, pool.count, batch_executor(pool, strategy),
                                   strategy.key, items=strategy.items, pool=pool, alone=strategy.inline)
    else:
        scheduler = DirectScheduler(pool)
    model = ModelVersion(name, version, config, scheduler, labels, executable.text, executable.on_cuda)
    if model_dir is not None and config.model_warmup:
        try:
            warm_up(pool, config, model.spec, model.stats, model_dir, version)
        except BaseException:
            model.close()
            raise
    return model
