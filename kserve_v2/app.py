"""Composition root: builds the manager, service, gRPC server and REST server, and runs their lifetime.

Lifecycle (Triton's: ``--strict-readiness`` and graceful shutdown): the port opens first (live, not ready); startup
models load; readiness turns on. On SIGTERM/SIGINT readiness and grpc.health.v1 turn NOT_SERVING at
once and Watch streams end, as do inference streams once their requests are answered; gRPC stops taking calls (new ones get UNAVAILABLE) while REST keeps
answering new requests with 503 + Retry-After; requests already admitted, including those still
uploading, get up to ``exit_timeout_secs`` to finish; the process goes on as soon as none is left,
models unload, exit 0.

grpc.health.v1 (the protocol Kubernetes' native gRPC probes speak) answers for the service names
"" and ``inference.GRPCInferenceService`` as ServerReady does, and for ``live`` as ServerLive
does (SERVING from start until shutdown begins): a liveness probe names ``live``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics

from kserve_v2.backend.custom_metrics import CustomMetrics
from kserve_v2.backend.host import BackendHost
from kserve_v2.grpc.server import SERVICE_NAME, build_server
from kserve_v2.observability.cpu_metrics import CpuCollector
from kserve_v2.observability.gpu import GpuCollector
from kserve_v2.observability.log_settings import LogSettings
from kserve_v2.observability.metrics import InferenceMetrics
from kserve_v2.observability.status import StatusReporter
from kserve_v2.observability.tracing import Tracing
from kserve_v2.protocol.errors import ServerError
from kserve_v2.repository import layout, poller
from kserve_v2.repository.manager import ModelManager
from kserve_v2.request.budget import MemoryBudget
from kserve_v2.request.offload import Offload
from kserve_v2.request.shared_memory import SharedMemoryRegistry
from kserve_v2.runtime.device import cuda_device_count
from kserve_v2.scheduling import rate_limiter
from kserve_v2.service.inference_service import InferenceService, ServerState
from kserve_v2.service.redis_cache import RedisResponseCache, ping
from kserve_v2.service.response_cache import CountedCache, ResponseCache
from kserve_v2.settings.cache_config import CacheConfig
from kserve_v2.settings.restrictions import parse_restrictions
from kserve_v2.settings.server import Settings, header_pattern
from kserve_v2.workers.replicas import Call, ReplicaGroup, ReplicaState
from kserve_v2.workers.replicated import ReplicatedService, observe_group
from transcoding.app import build_app, build_metrics_app
from transcoding.http.access import AccessMiddleware
from transcoding.http.limits import ConnectionLimits
from transcoding.http.server import HttpServer, TlsFiles
from transcoding.semantic.sie_metrics import SieMetrics

log = logging.getLogger(__name__)
LIVE_SERVICE = "live"  # grpc.health.v1 service name of liveness, for Kubernetes' gRPC liveness probe
GRPC_PICKUP_S = 0.2  # on SIGTERM, seconds gRPC goes on picking up calls that arrived before it


class App:
    """One server process, or one replica of ``--workers N`` (``group``: its link to the others;
    ``kserve_v2.workers.supervisor``): then its ports are shared (``SO_REUSEPORT``), its control calls reach
    every replica and its observers see all of them (``kserve_v2.workers.replicated``)."""

    def __init__(self, settings: Settings, group: ReplicaGroup | None = None) -> None:
        self.settings = settings
        self.group = group
        gpus = cuda_device_count()
        log.info("execution provider: %s", f"CUDA ({gpus} GPU)" if gpus else "CPU (no usable GPU)")
        self.state = ServerState(settings.strict_readiness)
        self.cpu: CpuCollector | None = None
        registry = None
        metrics = None
        custom_metrics = CustomMetrics()  # families model code creates (pb_utils.MetricFamily)
        if settings.allow_metrics:
            disable_created_metrics()  # no *_created series: Triton has none, and they double every family
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)  # process CPU seconds, resident and virtual memory
            metrics = InferenceMetrics(registry, settings.metrics_config)
            registry.register(custom_metrics)
            if gpus and settings.allow_gpu_metrics:
                registry.register(GpuCollector())
            if settings.allow_cpu_metrics:
                self.cpu = CpuCollector()
                registry.register(self.cpu)
        self.state.failure = layout.unreadable(settings.model_repositories)
        if self.state.failure and settings.exit_on_error:
            raise RuntimeError(self.state.failure)
        # initialization failed (--exit-on-error=false): no repository, health and metadata only
        repositories = [] if self.state.failure else list(settings.model_repositories)
        self.manager = ModelManager(repositories, gpus, self._on_change,
                                    ready_when_empty=settings.model_control_mode == "explicit")
        if registry is not None and metrics is not None:
            SieMetrics(metrics, self.manager, registry)
        self.tracing = Tracing(settings.trace_config, settings.server_name)
        memory = SharedMemoryRegistry() if settings.allow_client_shm else None
        logs = LogSettings(settings.log_verbose, (settings.log_info, settings.log_warning, settings.log_error),
                           settings.log_format, settings.log_file)
        budget = MemoryBudget(settings.max_request_decoded_bytes, settings.request_memory_pool_bytes)
        self.metrics = metrics
        self.offload = Offload()  # the decode threads and the JSON worker process, for gRPC and REST alike
        service_args = (self.manager, self.state, settings.server_name, settings.model_control_mode, metrics,
                        self.tracing, memory, logs, budget, self.offload)
        self.cache = cache = _response_cache(settings.cache_config)
        if cache is not None and registry is not None:
            registry.register(cache)
        self.service = (InferenceService(*service_args, cache=cache) if group is None
                        else ReplicatedService(group, *service_args, cache=cache))
        # what the backends get when they open a model: the service's calls, so the host follows the service
        self.manager.host = BackendHost(custom_metrics, self.service.calls, settings.backend_config,
                                        rate_limiter.from_settings(settings.rate_limit, settings.rate_limit_resources),
                                        settings.model_load)
        self.server, self.health, self.servicer, self.grpc_port = build_server(self.service, settings,
                                                                                reuse_port=group is not None)
        self.http: HttpServer | None = None
        http_settings = settings.http
        limits = ConnectionLimits(http_settings.header_timeout_secs, http_settings.body_timeout_secs,
                                  http_settings.max_header_size, http_settings.max_chunks)
        http_server = partial(HttpServer, exit_timeout_secs=settings.exit_timeout_secs, limits=limits,
                              keepalive_timeout_s=http_settings.keepalive_timeout_secs,
                              max_connections=http_settings.max_connections, reuse_port=group is not None)
        reporter = StatusReporter(self.manager, registry, gpus) if settings.allow_http else None
        exposition, status = _local_views(registry, reporter)
        if group is not None:
            exposition, status = observe_group(group, registry, reporter.snapshot if reporter else None)
        if settings.allow_http:
            app = build_app(self.service, http_settings.max_input_size, registry, status if reporter else None,
                            settings.openai_token_ids, http_settings.cors_allowed_origins, exposition,
                            header_pattern(http_settings.header_forward_pattern, "http-header-forward-pattern"))
            restrictions = parse_restrictions(http_settings.restricted_api)
            if restrictions or settings.api_key:  # otherwise no per-request work for access control
                app = AccessMiddleware(app, restrictions, settings.api_key)
            tls = None
            if http_settings.tls.enabled:
                tls = TlsFiles(http_settings.tls.server_cert, http_settings.tls.server_key, http_settings.tls.root_cert,
                               http_settings.tls.mutual)
            self.http = http_server(app, settings.http_address, settings.http_port, tls=tls,
                                    reuse_port=group is not None or settings.reuse_http_port)
        self.metrics_server: HttpServer | None = None
        if registry is not None:
            self.metrics_server = http_server(build_metrics_app(exposition), settings.metrics_address,
                                              settings.metrics_port)
        self._health_updates: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()  # set by SIGTERM / SIGINT, or by a failed startup under --exit-on-error
        self._exit_code = 0
        logs.install()  # after uvicorn has set up its loggers

    def _on_change(self) -> None:
        if self.metrics is not None:  # a loaded version's series start at 0, as Triton's
            self.metrics.loaded((record.name, str(version)) for record in self.manager.records()
                                for version in record.ready_numbers())
        if self.group is not None:
            self._report()
        self._on_view()

    def _on_view(self) -> None:
        task = asyncio.get_running_loop().create_task(self._publish_health())
        self._health_updates.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._health_updates.discard)

    async def _publish_health(self) -> None:
        serving = health_pb2.HealthCheckResponse.SERVING if self.service.is_ready() else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, serving)

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; returns the exit code."""
        loop = asyncio.get_running_loop()
        self.service.calls.loop = loop  # model code's calls (kserve_v2.backend.local_calls) run on this loop
        stop = self._stop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        live = health_pb2.HealthCheckResponse.NOT_SERVING if self.state.failure else health_pb2.HealthCheckResponse.SERVING
        await self.health.set(LIVE_SERVICE, live)
        if self.group is not None:
            self.group.on_view = self._on_view
            self.group.on_lost = partial(_orphaned, stop)
            self.group.handle("poll", lambda change: poller.follow(self.manager, *change))
            self.group.start()
        await self._publish_health()
        # a replica replacing one that died opens its ports once it has caught up with the others
        replacement = self.group is not None and self.group.restarted
        if not replacement:
            await self._open_ports()
        startup = loop.create_task(self._startup(open_ports=replacement))  # in poll mode it goes on polling
        interval = loop.create_task(self._metrics_interval())
        await stop.wait()
        log.info("shutting down: readiness off, waiting up to %d s for in-flight requests", self.settings.exit_timeout_secs)
        await self._drain()
        startup.cancel()
        interval.cancel()
        await self.manager.close()
        if self.cache is not None:
            await self.cache.close()
        self.offload.close()
        await asyncio.to_thread(self.tracing.shutdown)
        log.info("server stopped")
        return self._exit_code

    async def _open_ports(self) -> None:
        await self.server.start()
        log.info("gRPC server listening on %s:%d", self.settings.grpc_address, self.grpc_port)
        if self.http is not None:
            port = await self.http.start()
            log.info("HTTP server listening on %s:%d", self.settings.http_address, port)
        if self.metrics_server is not None:
            port = await self.metrics_server.start()
            log.info("metrics server listening on %s:%d", self.settings.metrics_address, port)

    def _report(self) -> None:
        """Tell the supervisor this replica's readiness and READY versions."""
        if self.group is None:
            return
        models = {record.name: record.ready_numbers() for record in self.manager.records()}
        self.group.report(ReplicaState(self.state.started, InferenceService.is_ready(self.service), models))

    async def _drain(self) -> None:
        """Readiness off, new requests turned away, admitted ones finished (within the exit timeout)."""
        deadline = time.monotonic() + self.settings.exit_timeout_secs
        self.state.draining = True
        self._report()
        await self.health.shut_down()  # NOT_SERVING to Check and to every Watch stream, which then ends
        self.servicer.drain()  # open ModelStreamInfer streams end once their requests are answered
        if self.http is not None:
            self.http.drain()
        # gRPC's shutdown drops calls whose headers are in but that the server has not picked up yet;
        # a moment first lets calls sent before SIGTERM be picked up (and then run to the end).
        await asyncio.sleep(GRPC_PICKUP_S)
        grpc_stopped = asyncio.ensure_future(self.server.stop(grace=self.settings.exit_timeout_secs))
        if self.http is not None:
            while self.http.in_flight() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await grpc_stopped
        grace = deadline - time.monotonic()  # the exit timeout bounds the whole drain
        await asyncio.gather(*(server.stop(grace) for server in (self.http, self.metrics_server) if server is not None))

    async def _metrics_interval(self) -> None:
        """Every ``--metrics-interval-ms``: read the CPU metrics, and add the requests so far to the
        inference families (the latency summaries' windows then follow the requests' time)."""
        if self.metrics is None:
            return
        while True:
            await asyncio.sleep(self.settings.metrics_interval_ms / 1000)
            if self.cpu is not None:
                self.cpu.refresh()
            self.metrics.fold()

    def _startup_names(self) -> list[str]:
        if self.settings.model_control_mode != "explicit" or "*" in self.settings.load_models:
            return self.manager.model_names()
        return list(dict.fromkeys(self.settings.load_models))

    async def _startup(self, open_ports: bool) -> None:
        """Load the startup models; a replica then joins the group (and opens its ports when it
        replaces one that died). In poll mode, follow the repository (replica 0 for the group)."""
        repositories = self.manager.repositories
        polling = self.settings.model_control_mode == "poll" and not self.state.failure
        # taken before loading, so that changes made while models load are seen by the first poll
        before = await asyncio.to_thread(poller.snapshot, repositories) if polling else {}
        await self._start_models()
        group = self.group
        if group is not None:
            self._report()
            await group.join()
            if open_ports:
                await self._open_ports()
        if polling and (group is None or group.index == 0):
            apply: poller.Apply = partial(poller.follow, self.manager)
            if group is not None:  # every replica applies each change, at once
                apply = partial(_poll_everywhere, group)
            await poller.poll(apply, repositories, self.settings.repository_poll_secs, before,
                              self.settings.model_load_thread_count)

    async def _start_models(self) -> None:
        if self.state.failure:
            log.error("server failed to initialize: %s; with --exit-on-error=false it stays up, not live and not "
                      "ready, answering health and metadata", self.state.failure)
            return
        names = self._startup_names()
        # What exists now (imported modules, settings, the server itself) lives as long as the process: out of
        # the collector's sight, a full collection (one per retired model version, and Python's own generation-2
        # passes) scans only what came after, 0.4 ms instead of 40-60 ms of a stalled event loop per reload.
        # Models load after this, so that the cycles of a version that is unloaded are still collected.
        gc.collect()
        gc.freeze()
        await self.manager.load_startup_models(names, self.settings.model_load_thread_count)
        if names and self.settings.exit_on_error and not self.manager.models_ready():
            # Triton's text ("error: creating server: Internal - failed to load all models"); each model's
            # reason was logged as it failed
            log.error("failed to load all models; exiting (--exit-on-error=false keeps the server up, not ready)")
            self._exit_code = 1
            self._stop.set()
            return
        self.state.started = True
        await self._publish_health()
        if self.group is not None:  # the supervisor says when the server is ready
            log.info("replica %d: startup models loaded", self.group.index)
        elif self.service.is_ready():
            log.info("server is ready")
        else:
            log.warning("server is live but not ready: a startup model failed to load (see RepositoryIndex)")


def _response_cache(config: CacheConfig | None) -> CountedCache | None:
    """Triton's response cache (``--cache-config``): the local one (each replica its own), or Redis
    (shared), pinged first; None when none is configured.

    Raises:
        RuntimeError: Redis cannot be reached ("Failed to initialize RedisCache: ...", Triton's text).
    """
    if config is None:
        return None
    if config.redis is None:
        return ResponseCache(config.size)
    ping(config.redis)
    return RedisResponseCache(config.redis)


def _orphaned(stop: asyncio.Event) -> None:
    """A replica whose supervisor has died drains and exits, freeing the ports for a new server."""
    if not stop.is_set():
        log.error("the supervisor has gone: shutting this replica down")
        stop.set()


async def _poll_everywhere(group: ReplicaGroup, name: str, present: bool) -> None:
    try:
        await group.everywhere(Call("poll", (name, present), logged=False, model=name))
    except ServerError as err:  # the next poll tries again
        log.error("poll: could not apply the change of '%s' on every replica: %s", name, err)


def _local_views(registry: CollectorRegistry | None, reporter: StatusReporter | None
                 ) -> tuple[Callable[[], Awaitable[CollectorRegistry]], Callable[[], Awaitable[dict[str, Any]]]]:
    """What /metrics and /ws/status read in one process: its registry and its status object."""

    async def exposition() -> CollectorRegistry:
        return registry if registry is not None else CollectorRegistry()

    async def status() -> dict[str, Any]:
        return reporter.snapshot() if reporter is not None else {}

    return exposition, status
