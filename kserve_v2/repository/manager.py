"""The model lifecycle: loads, reloads and unloads change the records of ``ModelRecords``
(``records.py``), which answers every question about them.

States per version are Triton's (``model_lifecycle.cc``): READY, UNAVAILABLE, LOADING,
UNLOADING, with a reason (empty when READY, "unloaded" after an unload, the error after a
failed load). Loads run off the event loop; a lock per model name keeps a load and an unload of
the same model from interleaving (it exists only while a call holds or awaits it, so names that
name no model leave nothing behind). A request holds its ``ModelVersion`` (``acquire``), so
swapping or removing a version never pulls it from under a running request.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.host import BackendHost
from kserve_v2.models.lifecycle import State
from kserve_v2.models.version import ModelVersion
from kserve_v2.protocol.errors import InternalError, InvalidInput, ServerError
from kserve_v2.repository import layout, remote
from kserve_v2.repository.loader import LoadResult, load_model
from kserve_v2.scheduling import ensemble
from kserve_v2.scheduling.ensemble_scheduler import EnsembleScheduler
from kserve_v2.repository.config import config_file
from kserve_v2.repository.overrides import (KeptConfig, LoadOverrides, OverrideError, parse_config_override,
                                            parse_load_parameters, poll_failure, write_private_folder)
from kserve_v2.protocol.model_spec import ModelSpec
from kserve_v2.repository.records import UNLOADED, ModelRecord, ModelRecords, VersionStatus

log = logging.getLogger(__name__)


class ModelManager(ModelRecords):
    """Owns the model records of one or more repositories: loads and unloads them (the queries are
    ``ModelRecords``'); the ``ModelLifecycle`` and ``Records`` the core reads models through.

    Args:
        repositories: repository root folders.
        gpus: CUDA devices usable by ONNX Runtime (0 on CPU hosts).
        on_change: called on the event loop after any state change (readiness, health).
        ready_when_empty: readiness when no model was asked for at start (explicit mode: True).

    Attributes:
        host: what the backends of the versions it opens get (``kserve_v2.backend.host``): a host of its
            own that serves no requests until the server (``kserve_v2.app``) hands in its own, whose calls
            are its service's (made from this manager).
    """

    def __init__(self, repositories: list[Path], gpus: int, on_change: Callable[[], None],
                 ready_when_empty: bool = False) -> None:
        super().__init__(repositories, ready_when_empty)
        self._gpus = gpus
        self._on_change = on_change
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # name -> (lock, calls holding or awaiting it)
        self._background: set[asyncio.Task[None]] = set()  # retiring versions, loads and unloads left by their callers
        self.step_runner: ensemble.StepRunner | None = None  # the inference call ensemble steps go through
        self.step_streamer: ensemble.StepStreamer | None = None  # and the stream call decoupled steps go through
        self.host = BackendHost()

    def config_name(self) -> str:
        """Triton's ``--model-config-name``, as the host's model load settings hold it."""
        return self.host.model_load.config_name

    async def load_startup_models(self, names: list[str], at_once: int = 1) -> None:
        """Load the models of the startup set, ``at_once`` at a time (Triton's
        ``--model-load-thread-count``); readiness waits for them (``models_ready``)."""
        self._startup.update(names)
        slots = asyncio.Semaphore(at_once)

        async def one(name: str) -> None:
            async with slots:
                if self.is_ready(name, ""):
                    return  # loaded already, as a step of an ensemble loaded before it
                try:
                    await self.load(name)
                except ServerError:
                    pass  # logged by load; the model's versions carry the reason

        await asyncio.gather(*(one(name) for name in names))

    async def load_requested(self, name: str, parameters: Mapping[str, pb.ModelRepositoryParameter]) -> None:
        """RepositoryModelLoad: ``load`` with the request's ``config`` / ``file:`` parameters.

        Raises:
            InvalidInput: an unknown parameter (Triton's "Unrecognized load parameter ...") -> INVALID_ARGUMENT.
            InvalidInput / InternalError: ``file:`` overrides that cannot form the model folder, or a
                ``config`` that is not ModelConfig JSON, with Triton's text (see ``overrides.poll_failure``).
            InvalidInput / InternalError: as ``load``.
        """
        try:
            overrides = parse_load_parameters(parameters)
        except OverrideError as err:
            raise poll_failure(name, err) from None
        await self.load(name, overrides)

    async def refresh(self) -> None:
        """Read the remote repositories' listings again on a worker thread (``remote.refresh``): a load and
        RepositoryIndex see the store's current content without the event loop waiting on the network."""
        await remote.refresh(self._repositories)

    async def load(self, name: str, overrides: LoadOverrides | None = None, _chain: tuple[str, ...] = ()) -> None:
        """Load ``name``, or reload it when loaded.

        A reload keeps every READY version serving until its replacement is READY. A load is
        all or nothing, as Triton's (``ModelLifeCycle::OnLoadComplete``): when a version fails to
        load, the versions this load did load are released and the versions that served go on
        serving, a version the policy no longer names included. Replaced and dropped versions
        unload in the background once their in-flight requests finish. An ensemble first loads its
        composing models that are not READY (as Triton does), then checks its steps against them.

        Raises:
            InvalidInput: an unsafe model name, or nothing could be loaded (Triton's text, see
                ``load_failure``) -> INVALID_ARGUMENT / 400.
            InternalError: no such folder, or a ``config`` override that is not ModelConfig JSON ("failed
                to load '<m>', failed to poll from model repository"; after it, the URL and reason of a
                remote repository that cannot be listed or read: ``remote.unlisted``, ``fetch_model``)
                -> INTERNAL / 500.

        A load without a ``config`` keeps the override of an earlier load until a file of the model's
        folder changes or the model is unloaded (Triton's core; ``overrides.KeptConfig``).
        """
        await self._to_the_end(self._load(name, overrides, _chain))

    async def _load(self, name: str, overrides: LoadOverrides | None, _chain: tuple[str, ...]) -> None:
        layout.validate_model_name(name)
        overrides = overrides or LoadOverrides()
        async with self._locked(name):
            if not _chain:  # an ensemble's steps load after the ensemble's own load listed the store
                await self.refresh()
            folder = self._folder(name, overrides)
            if not overrides.files:  # a remote repository's model folder is downloaded first
                await asyncio.to_thread(remote.fetch_model, folder)
            try:
                overrides, kept = self._poll(name, folder, overrides)
                record = self._records.setdefault(name, ModelRecord(name))
                for version in layout.version_dirs(folder):
                    record.versions.setdefault(version, VersionStatus(State.LOADING))
                self._on_change()
                started, rss_before = time.perf_counter(), _rss_bytes()
                result = await asyncio.to_thread(load_model, folder, name, self._gpus, overrides.config_json, self.host)
                if result.ensemble_versions:
                    await self._compose(name, result, (*_chain, name))
            finally:
                if overrides.files:
                    shutil.rmtree(folder, ignore_errors=True)
            elapsed_ms = (time.perf_counter() - started) * 1000
            error = self._apply(record, result)
            memory = (_rss_bytes() - rss_before) / 2**20
            if error:
                log.error("failed to load model '%s' in %.1f ms (RSS %+.1f MiB): %s", name, elapsed_ms, memory, error)
                raise InvalidInput(load_failure(name, result))
            for version, reason in result.failed.items():  # versions that failed beside ones that loaded
                log.error("failed to load model '%s' version %d: %s", name, version, reason)
            # kept once it has loaded: after a failed load, a load without parameters reloads what serves
            record.kept = kept
            record.memory_bytes = max(0, int(memory * 2**20))
            log.info("loaded model '%s' versions %s in %.1f ms (RSS %+.1f MiB)",
                     name, sorted(result.loaded), elapsed_ms, memory)

    async def _compose(self, name: str, result: LoadResult, chain: tuple[str, ...]) -> None:
        """Build an ensemble's versions into ``result`` once its composing models are loaded;
        a failure becomes ``result.error``, naming the step. An ensemble with a decoupled step is
        decoupled (its config's ``model_transaction_policy.decoupled`` is set, as Triton's
        ``ValidateEnsembleConfig`` sets it; ``ensemble.decoupled``)."""
        assert result.config is not None
        folders = layout.model_dirs(self._repositories)
        for index, model, _ in ensemble.composing_models(result.config):
            if model in chain:
                result.error = (f"ensemble '{name}' step {index}: model '{model}' is an ensemble that depends on "
                                f"'{name}' (circular dependency {' -> '.join((*chain, model))})")
                return
            if model in self._locks:  # being loaded meanwhile (models load at once): that load is the one
                async with self._locked(model):
                    pass
            if not self.is_ready(model, "") and model in folders:
                try:
                    await self.load(model, _chain=chain)
                except ServerError as err:
                    result.error = (f"ensemble '{name}' depends on '{model}' which is not valid (step {index}): "
                                    f"{str(err).rstrip()}")
                    return

        def lookup(model: str, version: int) -> ModelSpec | None:
            try:
                return self.resolve(model, str(version) if version > 0 else "").spec
            except ServerError:
                return None

        def is_decoupled(model: str, version: int) -> bool:
            try:
                return self.resolve(model, str(version) if version > 0 else "").decoupled
            except ServerError:
                return False

        try:
            steps = ensemble.plan(result.config, lookup, is_decoupled)
        except ensemble.EnsembleError as err:
            result.error = str(err)
            return
        if self.step_runner is None:
            result.error = f"ensemble '{name}' cannot run: the server has no inference call for its steps"
            return
        decoupled = ensemble.decoupled(steps)
        if decoupled or result.config.HasField("model_transaction_policy"):
            result.config.model_transaction_policy.decoupled = decoupled
        labels = ensemble.step_labels(result.config, result.labels, lookup)
        for version in result.ensemble_versions:
            scheduler = EnsembleScheduler(result.config, steps, self.step_runner, self.step_streamer)
            result.loaded[version] = ModelVersion(name, version, result.config, scheduler, labels)

    @asynccontextmanager
    async def _locked(self, name: str) -> AsyncIterator[None]:
        """Hold the lock of ``name``; the last call to let go of it drops it."""
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    def _poll(self, name: str, folder: Path, overrides: LoadOverrides) -> tuple[LoadOverrides, KeptConfig | None]:
        """What Triton's core does when it polls the model before a load: check a ``config`` override
        and keep it for later loads (not one with ``file:`` overrides); for a load without one, take
        the override a previous load kept while no file of the folder changed since.

        Returns:
            the overrides this load uses, and the ``config`` override the model keeps after it.

        Raises:
            InternalError: a ``config`` that is not ModelConfig JSON or names another model (Triton's
                "failed to load '<m>', failed to poll from model repository"); nothing changes.
        """
        if overrides.config_json is not None:
            try:
                parse_config_override(overrides.config_json, name)
            except OverrideError as err:
                raise poll_failure(name, err) from None
            used = str(config_file(folder, self.config_name()).relative_to(folder))
            return overrides, None if overrides.files else KeptConfig.taken(overrides.config_json, folder, used)
        record = self._records.get(name)
        kept = record.kept if record is not None else None
        if kept is None or layout.modified_ns(folder) > kept.stamp_ns:
            return overrides, None  # config.pbtxt (again)
        log.info("model '%s' keeps the configuration an earlier load provided", name)
        return LoadOverrides(kept.config_json), kept

    def _folder(self, name: str, overrides: LoadOverrides) -> Path:
        if overrides.files:
            try:
                return write_private_folder(overrides.files)
            except OverrideError as err:
                raise poll_failure(name, err) from None
        dirs = layout.model_dirs(self._repositories).get(name)
        if not dirs:  # Triton's text; with the URL and reason of a remote repository whose listing failed
            raise remote.unlisted(name)
        if len(dirs) > 1:
            raise InternalError(f"failed to load '{name}': the model appears in more than one model repository")
        return dirs[0]

    def _apply(self, record: ModelRecord, result: LoadResult) -> str:
        """Swap a load's outcome into the record; returns the failure reason when the load failed."""
        old = record.versions
        serving = {v: s for v, s in old.items() if s.state is State.READY and s.model is not None}
        if result.failed and not result.error:  # all or nothing: what served goes on serving
            for model in result.loaded.values():
                self._retire(model)
            failed = {v: VersionStatus(State.UNAVAILABLE, reason) for v, reason in result.failed.items()}
            record.versions = {**old, **failed, **serving}
            self._on_change()
            return "; ".join(result.failed.values())
        new: dict[int, VersionStatus] = {}
        for version, model in result.loaded.items():
            new[version] = VersionStatus(State.READY, "", model)
        if result.error:
            if serving:  # a failed reload keeps what serves
                new = dict(serving)
            else:
                new = {v: VersionStatus(State.UNAVAILABLE, result.error) for v in old}
                record.error = result.error
        else:
            record.config, record.error = result.config, ""
        keep = {id(s.model) for s in new.values() if s.model is not None}
        for status in serving.values():
            if id(status.model) not in keep:
                assert status.model is not None
                self._retire(status.model)
        for version, status in old.items():
            if version not in new and status.state is State.READY:
                new[version] = VersionStatus(State.UNAVAILABLE, UNLOADED)
        record.versions = new
        self._on_change()
        return result.error

    async def unload(self, name: str) -> None:
        """Unload every version of ``name``: drain in-flight requests, then free the sessions.

        Unloading a model that is not loaded succeeds (Triton). Names are not traversal-checked
        here: nothing touches the file system.
        """
        await self._to_the_end(self._unload(name))

    async def _unload(self, name: str) -> None:
        async with self._locked(name):
            record = self._records.get(name)
            self._startup.discard(name)  # unloaded on purpose: readiness no longer waits for it
            if record is None:
                return
            record.kept = None  # Triton forgets a model it unloads, with its config override
            models = [s.model for s in record.versions.values() if s.model is not None]
            for status in record.versions.values():
                if status.model is not None:
                    status.state, status.reason = State.UNLOADING, ""
            self._on_change()
            started, rss_before = time.perf_counter(), _rss_bytes()
            for model in models:
                await self._close(model)
            for status in record.versions.values():
                status.state, status.reason, status.model = State.UNAVAILABLE, UNLOADED, None
            record.error = ""  # a failed load no longer holds readiness back (Triton keeps it until a load)
            self._on_change()
            log.info("unloaded model '%s' in %.1f ms (RSS %+.1f MiB)", name,
                     (time.perf_counter() - started) * 1000, (_rss_bytes() - rss_before) / 2**20)

    async def unload_with_composing(self, name: str) -> None:
        """Unload ``name`` and, when it is an ensemble, the composing models no other loaded
        ensemble uses (Triton's ``unload_dependents``), recursively."""
        steps = self.composing_models(name)
        await self.unload(name)
        in_use = {step for other in list(self._records) for step in self.composing_models(other)}
        for step in sorted(steps - in_use):
            await self.unload_with_composing(step)

    def forget(self, name: str) -> None:
        """Drop the record of a model whose folder is gone (poll mode, after ``unload``)."""
        record = self._records.get(name)
        if record is not None and all(s.model is None for s in record.versions.values()):
            del self._records[name]
            self._on_change()

    async def _to_the_end(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a load or unload to its end even when its caller is cancelled (a client that gives
        up or times out must not leave versions LOADING or UNLOADING, or a loaded session with no
        record); the caller still sees its own cancellation, and the server's exit waits for it."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._settled)
        await asyncio.shield(task)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here: a failed load has been logged and raised to its caller

    def _retire(self, model: ModelVersion) -> None:
        task = asyncio.get_running_loop().create_task(self._close(model))
        self._background.add(task)
        task.add_done_callback(self._settled)

    @staticmethod
    async def _close(model: ModelVersion) -> None:
        await model.drained()
        await asyncio.to_thread(model.close)
        gc.collect()
        _trim_heap()

    async def close(self) -> None:
        """Unload every version (server exit)."""
        for name in list(self._records):
            await self.unload(name)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def load_failure(name: str, result: LoadResult) -> str:
    """Triton's text for a load that left nothing new READY (``model_repository_manager.cc`` and
    ``model_lifecycle.cc`` in triton-inference-server/core): ``load failed for model '<m>': version
    <v> is at UNAVAILABLE state: <reason>;`` for each failed version (the reason the repository
    index shows), or the model's own reason when it failed as a whole, then a newline."""
    if result.error:
        return f"load failed for model '{name}': {result.error}\n"
    reasons = "".join(f"version {version} is at {State.UNAVAILABLE.value} state: {reason};"
                      for version, reason in sorted(result.failed.items()))
    return f"load failed for model '{name}': {reasons}\n"


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps them mapped after a session closes)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc

