"""What the model manager knows of every model, and the questions asked of it: which versions are
READY (a request's resolution), the RepositoryIndex rows, the stored configurations, readiness.

States per version are Triton's (``kserve_v2.models.lifecycle.State``) with a reason (empty when READY,
"unloaded" after an unload, the error after a failed load). ``ModelManager`` (``manager.py``)
changes the records; everything here only reads them, on the event loop. A request holds its
``ModelVersion`` (``acquire``), so swapping or removing a version never pulls it from under it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.models.lifecycle import State
from kserve_v2.models.version import ModelVersion
from kserve_v2.protocol.errors import InvalidInput, NotFound, Unavailable
from kserve_v2.repository import layout
from kserve_v2.repository.config import ConfigError, config_file, read_config
from kserve_v2.repository.overrides import KeptConfig
from kserve_v2.scheduling import ensemble

DUPLICATE_REASON = "model appears in two or more repositories"  # Triton's RepositoryIndex reason
UNLOADED = "unloaded"  # the reason of a version unloaded (on request, or replaced), as Triton's index gives it

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
    memory_bytes: int = 0  # resident memory the last successful load added
    kept: KeptConfig | None = None  # a config override the loads without parameters keep (Triton's rule)

    def ready_numbers(self) -> frozenset[int]:
        """The numbers of the versions in state READY."""
        return frozenset(v for v, status in self.versions.items() if status.state is State.READY)


@dataclass(frozen=True)
class IndexEntry:
    """One RepositoryIndex row; version and state are empty for a never-loaded model."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


class ModelRecords:
    """The model records of one or more repositories, and every query on them.

    Args:
        repositories: repository root folders (a folder named twice is one repository).
        ready_when_empty: readiness when no model was asked for at start (explicit mode: True).
    """

    def __init__(self, repositories: list[Path], ready_when_empty: bool = False) -> None:
        unique: dict[Path, Path] = {}
        for repository in repositories:  # a folder named twice is one repository: Triton keeps a set of paths
            unique.setdefault(repository.resolve(), repository)
        self._repositories = list(unique.values())
        self._ready_when_empty = ready_when_empty
        self._records: dict[str, ModelRecord] = {}
        self._startup: set[str] = set()  # the models loaded at start: readiness waits for them, records or not
        # model folder -> (config.pbtxt's stat, its configuration as read): stored_config(s) read a file only when it changed
        self._stored: dict[Path, tuple[tuple[int, int, int] | None, mc.ModelConfig | None]] = {}

    @property
    def repositories(self) -> list[Path]:
        """The repository folders, each once."""
        return self._repositories

    def model_names(self) -> list[str]:
        """Every model folder name in the repositories."""
        return sorted(layout.model_dirs(self._repositories))

    def models_ready(self) -> bool:
        """Strict readiness, as Triton's ``InferenceServer::IsReady`` counts models: True when every model
        loaded at start and every model a load was asked for since (in explicit or poll mode) has each of
        its versions READY, or UNAVAILABLE because it was unloaded (on purpose, or a version a new one
        replaced). A model that is loading, or whose last load failed (its versions UNAVAILABLE with the
        error), makes it False until it loads or is unloaded. With no such model: ``ready_when_empty``."""
        names = self._startup | self._records.keys()
        if not names:
            return self._ready_when_empty
        for name in names:
            record = self._records.get(name)
            if record is None or record.error or not record.versions:
                return False
            if any(s.state is not State.READY and s.reason != UNLOADED for s in record.versions.values()):
                return False
        return True

    def index(self, ready_only: bool) -> list[IndexEntry]:
        """RepositoryIndex rows: every model folder, one row per known version."""
        rows: list[IndexEntry] = []
        folders = layout.model_dirs(self._repositories)
        for name in sorted(set(folders) | set(self._records)):
            record = self._records.get(name)
            if len(folders.get(name, ())) > 1:  # cannot load: UNAVAILABLE with Triton's reason
                if not ready_only:
                    rows.append(IndexEntry(name, "", State.UNAVAILABLE.value, DUPLICATE_REASON))
                continue
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

    def records(self) -> list[ModelRecord]:
        """Every model the server has loaded or tried to load, by name (no file system access)."""
        return [self._records[name] for name in sorted(self._records)]

    def stored_config(self, name: str) -> mc.ModelConfig | None:
        """The configuration of a model in the repositories, loaded or not: the completed one of its
        last load, else its folder's configuration file as read (``config.config_file``: ``config.pbtxt``
        or the ``--model-config-name`` one; no load; read again only once the file
        changes); None when the name is in no repository or its configuration cannot be read."""
        record = self._records.get(name)
        if record is not None and record.config is not None:
            return record.config
        dirs = layout.model_dirs(self._repositories).get(name)
        return self._read_stored(dirs[0], name) if dirs else None

    def stored_configs(self) -> Iterator[tuple[str, mc.ModelConfig]]:
        """(name, ``stored_config(name)``) of every model in the repositories and every model with a
        record, by name, skipping those without one: one scan of the repositories, and a file read
        only for a configuration that changed since it was last read."""
        dirs = layout.model_dirs(self._repositories)
        for folder in set(self._stored) - {found[0] for found in dirs.values()}:
            del self._stored[folder]  # the folder is gone
        for name in sorted(set(dirs) | set(self._records)):
            record = self._records.get(name)
            config = record.config if record is not None and record.config is not None else (
                self._read_stored(dirs[name][0], name) if name in dirs else None)
            if config is not None:
                yield name, config

    def config_name(self) -> str:
        """Triton's ``--model-config-name`` ("": ``config.pbtxt``); the manager's is its host's."""
        return ""

    def _read_stored(self, folder: Path, name: str) -> mc.ModelConfig | None:
        try:
            stat = config_file(folder, self.config_name()).stat()
            key: tuple[int, int, int] | None = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except OSError:
            key = None  # no config file: the configuration is completed from the model alone
        cached = self._stored.get(folder)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            config: mc.ModelConfig | None = read_config(folder, name, config_name=self.config_name())
        except ConfigError:
            config = None
        self._stored[folder] = (key, config)
        return config

    def ready_numbers(self, name: str) -> frozenset[int]:
        """The numbers of ``name``'s READY versions (none for an unknown model)."""
        record = self._records.get(name)
        return record.ready_numbers() if record is not None else frozenset()

    def knows(self, name: str) -> bool:
        """Whether ``name`` has a record (loaded, loading, failed or unloaded)."""
        return name in self._records

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
        """ModelReady: False for unknown models and versions, as Triton answers; an ensemble is
        ready only while every composing model is."""
        try:
            model = self.resolve(name, version)
        except (NotFound, Unavailable, InvalidInput):
            return False
        return all(self.is_ready(step, step_version) for step, step_version in ensemble.step_versions(model.config))

    def composing_models(self, name: str) -> set[str]:
        """The models the READY versions of ensemble ``name`` run as steps (empty for other models)."""
        record = self._records.get(name)
        if record is None:
            return set()
        return {step for status in record.versions.values() if status.model is not None
                for step, _ in ensemble.step_versions(status.model.config)}

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
        """Resolve and hold a version for the duration of a request (unload waits for it)."""
        model = self.acquire_version(name, version)
        try:
            yield model
        finally:
            model.release()

    def acquire_version(self, name: str, version: str) -> ModelVersion:
        """Resolve and hold a version; the caller calls ``release()`` on it when done (see ``acquire``)."""
        model = self.resolve(name, version)
        model.hold()
        return model


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
