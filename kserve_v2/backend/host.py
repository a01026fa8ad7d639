"""The server as the backends see it when they open a model: ``BackendHost``.

Triton's backends reach their server through the model they open (``TRITONBACKEND_ModelServer`` in
Triton's backend API, ``tritonbackend.h``). Here each server (``kserve_v2.app.App``) builds one
``BackendHost`` from its settings and hands it to every model it loads: the repository passes it to
the backend's opener (``kserve_v2.backend.Backend``) and its rate limiter to the version's instances
(``kserve_v2.scheduling.instances``). Nothing of it is process-wide, so two servers in one process
(tests, tools) keep their custom metrics, model code's calls, python backend settings and rate
limiter apart.

The rate limiter is ``kserve_v2.scheduling.rate_limiter.RateLimiter``; this layer sits below the
schedulers, so it names the limiter by the ``RateLimiting`` protocol (what a version's instances
ask of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.custom_metrics import CustomMetrics
from kserve_v2.backend.local_calls import LocalCalls
from kserve_v2.settings.backend_config import BackendConfig
from kserve_v2.settings.server import ModelLoadSettings


class Allocation(Protocol):
    """An instance and the rate limiter resources it holds for one execution."""

    def release(self, executed: bool = True) -> None:
        """Free the instance and its resources (``executed``: an execution ran; event loop only)."""
        ...


class LimitedInstances(Protocol):
    """The instances of one loaded version, registered with the rate limiter."""

    async def acquire(self) -> Allocation:
        """Wait for a free instance and the resources it needs (event loop only); the caller's until released."""
        ...

    def close(self) -> None:
        """Unregister the version (after its last execution)."""
        ...


class RateLimiting(Protocol):
    """The server's rate limiter (Triton's ``--rate-limit execution_count``), as a version's instances use it."""

    def register(self, groups: Sequence[mc.ModelInstanceGroup]) -> LimitedInstances:
        """Register a version's instance groups.

        Raises:
            kserve_v2.scheduling.rate_limiter.RateLimitError: resources that cannot be granted (the
                version's load failure reason, Triton's text).
        """
        ...


@dataclass(frozen=True, slots=True)
class BackendHost:
    """What one server gives the models it loads (see the module docstring). The defaults are a host
    of its own that serves no requests (tests, tools).

    Attributes:
        custom_metrics: the metric families model code creates (``kserve_v2.backend.custom_metrics``),
            exported in this server's ``/metrics``.
        calls: this server's inference and model control calls, for model code (business logic scripting
            and the model loading API, ``kserve_v2.backend.local_calls``); None: a host that serves no
            requests (the model loading API is refused).
        backend_config: the backends' settings (``--backend-config``: the python backend's shared memory
            regions of models run in stub processes, the onnxruntime backend's thread pools, the
            ``max_batch_size`` auto-complete gives: ``kserve_v2.settings.backend_config``).
        rate_limiter: the rate limiter every loaded version's instances share (``--rate-limit
            execution_count``); None: rate limiting is off (Triton's default).
        model_load: how the repository reads and loads models (``--model-config-name``,
            ``--disable-auto-complete-config``, ``--model-load-retry-count``: ``kserve_v2.repository.loader``).
    """

    custom_metrics: CustomMetrics = field(default_factory=CustomMetrics)
    calls: LocalCalls | None = None
    backend_config: BackendConfig = BackendConfig()
    rate_limiter: RateLimiting | None = None
    model_load: ModelLoadSettings = ModelLoadSettings()
