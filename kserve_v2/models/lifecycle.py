"""The model lifecycle as the core sees it: the interfaces the repository implements.

The core (the inference service, the Prometheus collectors, the status reporter) reads and drives
models only through these Protocols; ``kserve_v2.repository.manager.ModelManager`` provides them
and the composition root (``kserve_v2.app``) hands it in. The core thus imports nothing from the
repository (the import contracts in pyproject.toml, docs/development.md).

Version states are ``State``, with Triton's names (model repository extension, ``RepositoryIndex``):
READY, UNAVAILABLE, LOADING, UNLOADING.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: readers of these interfaces need not import the runtime
    from kserve_v2._proto import grpc_service_pb2 as pb
    from kserve_v2._proto import model_config_pb2 as mc
    from kserve_v2.models.version import ModelVersion
    from kserve_v2.scheduling.ensemble import StepRunner, StepStreamer


class State(enum.Enum):
    """A version's lifecycle state, with Triton's names (``model_lifecycle.cc`` in
    triton-inference-server/core)."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


READY = State.READY.value  # the ``value`` of a servable version's state, which the reporters compare


class VersionView(Protocol):
    """One version of a model (the repository's ``VersionStatus`` provides it)."""

    @property
    def state(self) -> State:
        """Its lifecycle state."""
        ...

    @property
    def model(self) -> ModelVersion | None:
        """The servable version while READY."""
        ...


class RecordView(Protocol):
    """One model name (the repository's ``ModelRecord`` provides it)."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> mc.ModelConfig | None: ...

    @property
    def versions(self) -> Mapping[int, VersionView]: ...

    @property
    def memory_bytes(self) -> int:
        """Resident memory the last successful load added (bytes)."""
        ...


class Records(Protocol):
    """Every model record, for the readers that report on all models (status, SIE's model gauges)."""

    def records(self) -> Sequence[RecordView]:
        """Every model the server has loaded or tried to load, by name."""
        ...


class IndexRow(Protocol):
    """One RepositoryIndex row; version and state are empty for a never-loaded model."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def reason(self) -> str: ...


class ModelLifecycle(Protocol):
    """What ``InferenceService`` asks of the model lifecycle (Triton's model repository extension
    and the resolution of a request's model and version).

    Errors are the core's (``kserve_v2.protocol.errors``): NotFound for an unknown model or version,
    Unavailable for a version that is not READY, InvalidInput for a bad version string or load
    parameter, InternalError for a failed load.
    """

    step_runner: StepRunner | None
    """The inference call ensemble steps go through (the service sets it)."""

    step_streamer: StepStreamer | None
    """The stream call decoupled ensemble steps go through (the service sets it)."""

    def models_ready(self) -> bool:
        """Whether every model loaded at start or asked for since is READY (strict readiness, as Triton)."""
        ...

    def knows(self, name: str) -> bool:
        """Whether ``name`` has a record (loaded, loading, failed or unloaded)."""
        ...

    def stored_config(self, name: str) -> mc.ModelConfig | None:
        """A repository model's configuration whether or not it is loaded; None when there is none."""
        ...

    def stored_configs(self) -> Iterator[tuple[str, mc.ModelConfig]]:
        """(name, ``stored_config(name)``) of every model that has one, by name, in one pass."""
        ...

    def is_ready(self, name: str, version: str) -> bool:
        """ModelReady (False for unknown models and versions)."""
        ...

    def resolve(self, name: str, version: str) -> ModelVersion:
        """The READY version a request names (empty version: the newest READY one)."""
        ...

    def ready_versions(self, name: str) -> list[ModelVersion]:
        """Every READY version of a known model, ascending."""
        ...

    def all_ready_versions(self) -> Iterable[ModelVersion]:
        """Every READY version of every model, by name then version."""
        ...

    def ready_numbers(self, name: str) -> frozenset[int]:
        """The numbers of ``name``'s READY versions (none for an unknown model)."""
        ...

    def acquire(self, name: str, version: str) -> AbstractContextManager[ModelVersion]:
        """Resolve and hold a version for the duration of a request."""
        ...

    def acquire_version(self, name: str, version: str) -> ModelVersion:
        """Resolve and hold a version; the caller calls ``release()`` on it when done."""
        ...

    def index(self, ready_only: bool) -> Sequence[IndexRow]:
        """RepositoryIndex rows: every model folder, one row per known version."""
        ...

    async def refresh(self) -> None:
        """Read the listings of the remote repositories again, off the event loop (synchronous readers such as
        ``index`` and ``stored_config`` see the last listing when called on the loop)."""
        ...

    async def load_requested(self, name: str, parameters: Mapping[str, pb.ModelRepositoryParameter]) -> None:
        """RepositoryModelLoad: load or reload ``name`` with the request's ``config`` / ``file:`` parameters."""
        ...

    async def unload(self, name: str) -> None:
        """RepositoryModelUnload: unload after in-flight requests finish."""
        ...

    async def unload_with_composing(self, name: str) -> None:
        """Unload an ensemble and the composing models no other ensemble uses (``unload_dependents``)."""
        ...
