"""The service of one replica among several (``--workers N``): it answers as one server.

``ReplicatedExtensions`` sends every call that changes what a server holds (model load and unload,
system shared memory register and unregister, trace and log setting updates) to every replica
through the supervisor (``ReplicaGroup.everywhere``) and answers once they all have applied it;
it says how to take each back (``Outcome.undo``), which the supervisor uses when a call failed on
some replicas only. ``RepositoryIndex`` merges every replica's index. ``ReplicatedService`` is
ready only when every replica is, calls a model ready only when its READY versions are the same on
every replica, and totals ``ModelStatistics`` over the replicas. The request path is
``InferenceService``'s, unchanged: a replica serves its own connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.models.lifecycle import ModelLifecycle
from kserve_v2.observability.log_settings import LogSettings
from kserve_v2.observability.metrics import InferenceMetrics
from kserve_v2.observability.trace_settings import TraceSettings
from kserve_v2.observability.tracing import Tracing
from kserve_v2.protocol.errors import NotFound
from kserve_v2.request.budget import MemoryBudget
from kserve_v2.request.offload import Offload
from kserve_v2.request.shared_memory import SharedMemoryRegistry
from kserve_v2.service.extensions import TritonExtensions, requested_model
from kserve_v2.service.inference_service import InferenceService, ServerState
from kserve_v2.service.response_cache import CountedCache
from kserve_v2.workers.replica_views import merge_families, merge_index, merge_statistics, merge_status, values
from kserve_v2.workers.replicas import Call, Outcome, ReplicaGroup

CONTROL = "control"  # the kind of the calls ReplicatedExtensions applies on each replica
Local = Callable[[TritonExtensions, Any], Awaitable[Any]]
# the extension calls that change a replica, applied on each one by TritonExtensions' own methods
_LOCAL: dict[str, Local] = {
    "repository_model_load": TritonExtensions.repository_model_load,
    "repository_model_unload": TritonExtensions.repository_model_unload,
    "system_shared_memory_register": TritonExtensions.system_shared_memory_register,
    "system_shared_memory_unregister": TritonExtensions.system_shared_memory_unregister,
    "trace_setting": TritonExtensions.trace_setting,
    "log_settings": TritonExtensions.log_settings,
}


class ReplicatedExtensions(TritonExtensions):
    """``TritonExtensions`` whose changes reach every replica before they answer (see the module
    docstring). Errors are ``TritonExtensions``', from the first replica where the call failed."""

    def __init__(self, group: ReplicaGroup, manager: ModelLifecycle, control_mode: str,
                 shared_memory: SharedMemoryRegistry | None, traces: TraceSettings, logs: LogSettings) -> None:
        super().__init__(manager, control_mode, shared_memory, traces, logs)
        self._group = group
        group.handle(CONTROL, self._apply)
        group.handle("index", self._local_index)

    async def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        outcomes = await self._group.gather(Call("index"))
        return merge_index(values(outcomes), request.ready)

    async def _local_index(self, _: Any) -> pb.RepositoryIndexResponse:
        return await TritonExtensions.repository_index(self, pb.RepositoryIndexRequest())

    async def repository_model_load(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        self.require_explicit()  # refused here: no replica need be asked
        name = requested_model(request)
        response: pb.RepositoryModelLoadResponse = await self._model_control("repository_model_load", request, name)
        return response

    async def repository_model_unload(self, request: pb.RepositoryModelUnloadRequest
                                      ) -> pb.RepositoryModelUnloadResponse:
        self.require_explicit()
        name = requested_model(request)
        response: pb.RepositoryModelUnloadResponse = await self._model_control("repository_model_unload", request, name)
        return response

    async def system_shared_memory_register(self, request: pb.SystemSharedMemoryRegisterRequest
                                            ) -> pb.SystemSharedMemoryRegisterResponse:
        response: pb.SystemSharedMemoryRegisterResponse = await self._everywhere(
            "system_shared_memory_register", request, f"shm:{request.name}")
        return response

    async def system_shared_memory_unregister(self, request: pb.SystemSharedMemoryUnregisterRequest
                                              ) -> pb.SystemSharedMemoryUnregisterResponse:
        response: pb.SystemSharedMemoryUnregisterResponse = await self._everywhere(
            "system_shared_memory_unregister", request, f"shm:{request.name or '*'}")
        return response

    async def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        if not request.settings:  # a read: every replica holds the same settings
            return await super().trace_setting(request)
        response: pb.TraceSettingResponse = await self._everywhere("trace_setting", request)
        return response

    async def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        if not any(v.WhichOneof("parameter_choice") for v in request.settings.values()):
            return await super().log_settings(request)
        response: pb.LogSettingsResponse = await self._everywhere("log_settings", request)
        return response

    async def _everywhere(self, method: str, request: Any, key: str | None = None, model: str | None = None) -> Any:
        return await self._group.everywhere(Call(CONTROL, (method, request), key, model=model))

    async def _model_control(self, method: str, request: Any, name: str) -> Any:
        return await self._everywhere(method, request, f"model:{name}", name)

    async def _apply(self, payload: tuple[str, Any]) -> Outcome:
        """One replica's part of a control call: ``TritonExtensions``' own method, and its undo."""
        method, request = payload
        undo = self._undo(method, request)  # read before the call changes what it reads
        return Outcome(await _LOCAL[method](self, request), undo=undo)

    def _undo(self, method: str, request: Any) -> tuple[Call, ...]:
        """The calls that take back ``method`` (none for calls that fail alike on every replica)."""
        if method == "repository_model_load":  # a reload's previous version is gone: unloaded everywhere
            name = requested_model(request)
            unload = pb.RepositoryModelUnloadRequest(model_name=name)
            return (Call(CONTROL, ("repository_model_unload", unload), f"model:{name}"),)
        if method == "system_shared_memory_register":
            back = pb.SystemSharedMemoryUnregisterRequest(name=request.name)
            return (Call(CONTROL, ("system_shared_memory_unregister", back), f"shm:{request.name}"),)
        if method == "system_shared_memory_unregister" and self._memory is not None:
            try:
                regions = self._memory.status(request.name)
            except NotFound:
                return ()
            return tuple(Call(CONTROL, ("system_shared_memory_register", pb.SystemSharedMemoryRegisterRequest(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)), f"shm:{r.name}") for r in regions)
        return ()


class ReplicatedService(InferenceService):
    """``InferenceService`` of one replica among several (see the module docstring); arguments are
    ``InferenceService``'s after the ``group``."""

    def __init__(self, group: ReplicaGroup, manager: ModelLifecycle, state: ServerState, server_name: str,
                 control_mode: str, metrics: InferenceMetrics | None = None, tracing: Tracing | None = None,
                 shared_memory: SharedMemoryRegistry | None = None, logs: LogSettings | None = None,
                 budget: MemoryBudget | None = None, offload: Offload | None = None,
                 cache: CountedCache | None = None) -> None:  # cache: this replica's own (local) or shared (redis)
        super().__init__(manager, state, server_name, control_mode, metrics, tracing, shared_memory, logs, budget,
                         offload, extensions=partial(ReplicatedExtensions, group), cache=cache)
        self._group = group
        group.handle("statistics", self._local_statistics)
        group.track(manager.ready_numbers)

    def is_ready(self) -> bool:
        """Ready when this replica and every other one are (``GroupView.ready``)."""
        return self.local_ready() and self._group.view.ready

    def local_ready(self) -> bool:
        """This replica's own readiness, which it reports to the supervisor."""
        return super().is_ready()

    def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        """Ready on this replica, and READY in the same versions on every replica."""
        response = super().model_ready(request)
        if request.name in self._group.view.unsettled or self._group.changed(request.name):
            response.ready = False
        return response

    async def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """Every replica's statistics added up (``replica_views.merge_statistics``).

        Raises:
            NotFound / Unavailable / InvalidInput: an unknown model or version on every replica.
        """
        return merge_statistics(values(await self._group.gather(Call("statistics", request))))

    async def _local_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        return await super().model_statistics(request)


class ReplicaCollector(Collector):
    """The group's families, which every replica reports alike: ``kserve_v2_replicas`` (replicas
    serving) and ``kserve_v2_replica_restarts_total`` (replicas replaced after they died)."""

    def __init__(self, group: ReplicaGroup) -> None:
        self._group = group

    def collect(self) -> Iterator[Metric]:
        """Called by the registry at each scrape."""
        view = self._group.view
        yield GaugeMetricFamily("kserve_v2_replicas", "Worker replicas serving (--workers)", value=view.replicas)
        yield CounterMetricFamily("kserve_v2_replica_restarts", "Worker replicas restarted after they died",
                                  value=view.restarts)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def observe_group(group: ReplicaGroup, registry: CollectorRegistry | None, status: Callable[[], dict[str, Any]] | None
                  ) -> tuple[Callable[[], Awaitable[CollectorRegistry]], Callable[[], Awaitable[dict[str, Any]]]]:
    """Answer the supervisor's gathers of this replica's metric families and status object, and
    return what /metrics and /ws/status read instead of this replica's alone: every replica's,
    merged (``replica_views``)."""
    if registry is not None:
        local_registry = registry
        group.handle("metrics", lambda _: _now(list(local_registry.collect())))
        registry.register(ReplicaCollector(group))
    if status is not None:
        local_status = status
        group.handle("status", lambda _: _now(local_status()))

    async def families() -> CollectorRegistry:
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_Fixed(merge_families(values(await group.gather(Call("metrics"))))))
        return merged

    async def snapshot() -> dict[str, Any]:
        return merge_status(values(await group.gather(Call("status"))))

    return families, snapshot


async def _now(value: Any) -> Any:
    return value
