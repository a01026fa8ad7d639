"""The model lifecycle: one place that knows every model's versions and their states.

States per version are Triton's (``model_lifecycle.cc``): READY, UNAVAILABLE, LOADING,
UNLOADING, with a reason (empty when READY, "unloaded" after an unload, the error after a
failed load). Loads run off the event loop; a lock per model name keeps a load and an unload of
the same model from interleaving. A request holds its ``ModelVersion`` (``acquire``), so
swapping or removing a version never pulls it from under a running request.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.errors import InternalError, InvalidInput, NotFound, Unavailable
from kserve_v2.model import ModelVersion
from kserve_v2.repository import layout
from kserve_v2.repository.loader import load_model

log = logging.getLogger(__name__)


class State(enum.Enum):
    """A version's lifecycle state, with Triton's names."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass
class VersionStatus:
    """State, reason and (when READY) the servable version."""

    state: State
    reason: str = ""
    model: ModelVersion | None = None


@dataclass
class ModelRecord:
    """Everything known about one model name."""

    name: str
    config: mc.ModelConfig | None = None
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class IndexEntry:
    """One RepositoryIndex row; version and state are empty for a never-loaded model."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


class ModelManager:
    """Owns the model records of one or more repositories.

    Args:
        repositories: repository root folders.
        gpus: CUDA devices usable by ONNX Runtime (0 on CPU hosts).
        on_change: called on the event loop after any state change (readiness, health).
    """

    def __init__(self, repositories: list[Path], gpus: int, on_change: Callable[[], None]) -> None:
        self._repositories = repositories
        self._gpus = gpus
        self._on_change = on_change
        self._records: dict[str, ModelRecord] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._startup: set[str] = set()

    async def load_startup_models(self) -> None:
        """Load every model folder of every repository (control mode ``none``)."""
        names = sorted(layout.model_dirs(self._repositories))
        self._startup.update(names)
        for name in names:
            await self.load(name)

    async def load(self, name: str) -> None:
        """Load every version of ``name`` selected by its version policy.

        The result is recorded in the model's states; a failed load leaves the versions
        UNAVAILABLE with the reason.

        Raises:
            InvalidInput: an unsafe model name -> INVALID_ARGUMENT.
            InternalError: no such folder in any repository (Triton's text) -> INTERNAL.
        """
        layout.validate_model_name(name)
        async with self._locks[name]:
            dirs = layout.model_dirs(self._repositories).get(name)
            if not dirs:
                raise InternalError(f"failed to load '{name}', failed to poll from model repository")
            record = self._records.setdefault(name, ModelRecord(name))
            if len(dirs) > 1:
                record.error = f"model '{name}' appears in more than one model repository"
                self._set_failed(record, layout.version_dirs(dirs[0]), record.error)
                return
            for status in record.versions.values():
                status.state = State.LOADING
            self._on_change()
            started = time.perf_counter()
            result = await asyncio.to_thread(load_model, dirs[0], name, self._gpus)
            elapsed_ms = (time.perf_counter() - started) * 1000
            record.config, record.error = result.config, result.error
            if result.error:
                log.error("failed to load model '%s' in %.1f ms: %s", name, elapsed_ms, result.error)
                self._set_failed(record, layout.version_dirs(dirs[0]), result.error)
                return
            record.versions = {v: VersionStatus(State.READY, "", m) for v, m in result.loaded.items()}
            for version, reason in result.failed.items():
                log.error("%s", reason)
                record.versions[version] = VersionStatus(State.UNAVAILABLE, reason)
            for version in sorted(result.loaded):
                log.info("loaded model '%s' version %d in %.1f ms", name, version, elapsed_ms)
            self._on_change()

    def _set_failed(self, record: ModelRecord, versions: list[int], reason: str) -> None:
        record.versions = {v: VersionStatus(State.UNAVAILABLE, reason) for v in versions}
        self._on_change()

    async def close(self) -> None:
        """Unload every version (server exit)."""
        for record in self._records.values():
            for status in record.versions.values():
                if status.model is not None:
                    await asyncio.to_thread(status.model.close)
                    status.model = None
                    status.state, status.reason = State.UNAVAILABLE, "unloaded"

    # ---- queries -------------------------------------------------------------------------

    def startup_models_ready(self) -> bool:
        """True when at least one model was loaded at start and every one of them is READY."""
        if not self._startup:
            return False
        for name in self._startup:
            record = self._records.get(name)
            if record is None or record.error or not record.versions:
                return False
            if any(s.state is not State.READY for s in record.versions.values()):
                return False
        return True

    def index(self, ready_only: bool) -> list[IndexEntry]:
        """RepositoryIndex rows: every model folder, one row per known version."""
        rows: list[IndexEntry] = []
        for name in sorted(set(layout.model_dirs(self._repositories)) | set(self._records)):
            record = self._records.get(name)
            if record is None or not record.versions:
                if record is not None and record.error and not ready_only:
                    rows.append(IndexEntry(name, "", State.UNAVAILABLE.value, record.error))
                elif record is None and not ready_only:
                    rows.append(IndexEntry(name))
                continue
            for version, status in sorted(record.versions.items()):
                if ready_only and status.state is not State.READY:
                    continue
                rows.append(IndexEntry(name, str(version), status.state.value, status.reason))
        return rows

    def record(self, name: str) -> ModelRecord:
        """The record of a known model.

        Raises:
            NotFound: "Request for unknown model: '<m>' is not found" -> NOT_FOUND.
        """
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return record

    def resolve(self, name: str, version: str) -> ModelVersion:
        """The READY version a request names; an empty version means the newest READY one.

        Raises:
            NotFound: unknown model, unknown version, or no READY version -> NOT_FOUND.
            InvalidInput: a version string that is not an integer > 0 -> INVALID_ARGUMENT.
            Unavailable: the version exists but is not READY -> UNAVAILABLE.
        """
        record = self.record(name)
        if not version:
            ready = [v for v, s in record.versions.items() if s.state is State.READY]
            if not ready:
                raise NotFound(f"Request for unknown model: '{name}' has no available versions")
            model = record.versions[max(ready)].model
            assert model is not None
            return model
        number = parse_version(version)
        status = record.versions.get(number)
        if status is None:
            raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
        if status.state is not State.READY or status.model is None:
            raise Unavailable(f"Request for unknown model: '{name}' version {number} is not at ready state")
        return status.model

    def is_ready(self, name: str, version: str) -> bool:
        """ModelReady: False for unknown models and versions, as Triton answers."""
        try:
            self.resolve(name, version)
        except (NotFound, Unavailable, InvalidInput):
            return False
        return True

    def ready_versions(self, name: str) -> list[ModelVersion]:
        """Every READY version of a known model, ascending."""
        record = self.record(name)
        return [s.model for _, s in sorted(record.versions.items()) if s.state is State.READY and s.model]

    def all_ready_versions(self) -> Iterator[ModelVersion]:
        """Every READY version of every model, by name then version."""
        for name in sorted(self._records):
            yield from self.ready_versions(name)

    @contextmanager
    def acquire(self, name: str, version: str) -> Iterator[ModelVersion]:
        """Resolve and hold a version for the duration of a request (counted in ``inflight``)."""
        model = self.resolve(name, version)
        model.inflight += 1
        try:
            yield model
        finally:
            model.inflight -= 1


def parse_version(version: str) -> int:
    """Parse a request's version string.

    Raises:
        InvalidInput: Triton's "failed to get model version from specified version string"
            -> INVALID_ARGUMENT.
    """
    if not version.isdigit() or int(version) <= 0 or len(version) > 18:
        raise InvalidInput(
            f"failed to get model version from specified version string '{version}' "
            "(details: not an integer), version should be an integral value > 0"
        )
    return int(version)
