"""InferenceService: the V2 inference RPCs, the one request path. ModelInfer takes and gives the wire
codec's request and response objects (``kserve_v2.codec``), the other RPCs protobuf messages.

Health, metadata, configuration, statistics and ModelInfer are here; Triton's repository, shared
memory, trace and logging extensions are its ``extensions`` (``kserve_v2.service.extensions``), and the
semantic routes' text models its ``text`` (``kserve_v2.service.text_models``), each for its own audience.
The gRPC servicer delegates here method by method; the REST and semantic front ends transcode into
the same calls. Nothing here imports a transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import nullcontext
from dataclasses import replace

import numpy as np

from kserve_v2 import __version__
from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import RequestContext
from kserve_v2.backend.decoupled import ResponseStream, Streamed
from kserve_v2.backend.local_calls import CALLERS, LocalCalls, check_callers
from kserve_v2.codec.generated import request_from_message
from kserve_v2.codec.messages import InferRequest, InferResponse
from kserve_v2.models.lifecycle import ModelLifecycle
from kserve_v2.models.version import ModelVersion
from kserve_v2.observability.log_settings import LogSettings
from kserve_v2.observability.metrics import V2_API, InferenceMetrics
from kserve_v2.observability.tracing import RequestTrace, Tracing
from kserve_v2.protocol.errors import ErrorCode, InternalError, ServerError, Unsupported
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.request.budget import MemoryBudget, request_cost
from kserve_v2.request.decode import DecodedRequest, decode_request
from kserve_v2.request.encode import encode_response
from kserve_v2.request.offload import Offload, is_heavy
from kserve_v2.request.shared_memory import SharedMemoryRegistry
from kserve_v2.service.extensions import ExtensionsFactory, TritonExtensions
from kserve_v2.service.response_cache import CountedCache, Lookup
from kserve_v2.service.streaming import stream_request
from kserve_v2.service.text_models import TextModels
from kserve_v2.settings.server import Settings
from kserve_v2.settings.trace_config import TraceConfig

log = logging.getLogger(__name__)

# Extensions this server implements (Triton's names, ServerMetadata.extensions).
EXTENSIONS = ("classification", "model_repository", "model_repository(unload_dependents)", "model_configuration",
              "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics", "sequence", "trace", "logging",
              "generate", "schedule_policy")
SHM_EXTENSION = "system_shared_memory"
# Triton's text for a request answered once to a model that may answer many times (``infer_handler.cc``)
DECOUPLED_ONCE = "ModelInfer RPC doesn't support models with decoupled transaction policy"
_UNRESERVED = nullcontext()


class ServerState:
    """Readiness inputs: startup finished, draining, strict readiness (Triton's rules), and
    whether initialization failed.

    Ready means: startup loading finished, not draining, and, with strict readiness, every
    model loaded at startup is READY (Triton's ``--strict-readiness``; ``src/server.cc`` ``IsReady``).
    Live means initialization did not fail (``failure`` is empty): a server started with
    ``--exit-on-error=false`` on a repository it cannot read stays up, neither live nor ready, as
    Triton's does in its SERVER_FAILED_TO_INITIALIZE state.
    """

    def __init__(self, strict_readiness: bool) -> None:
        self.strict_readiness = strict_readiness
        self.started = False
        self.draining = False
        self.failure = ""  # why initialization failed, or ""


class InferenceService:
    """The inference RPCs of GRPCInferenceService as transport-free coroutines and functions, with
    Triton's other extensions (``extensions``) and the semantic routes' text models (``text``).

    Args:
        manager: the model lifecycle (the repository's ``ModelManager``, handed in by ``kserve_v2.app``).
        state: readiness inputs.
        server_name: ServerMetadata name (``triton`` for clients that check it).
        control_mode: model control mode; only ``explicit`` allows load and unload RPCs.
        metrics: Triton's Prometheus families, or None when metrics are off.
        tracing: OpenTelemetry request spans (off when None).
        shared_memory: registered system shared memory regions, or None when client shared
            memory is off (``--allow-client-shm``).
        logs: the log settings of Triton's logging extension.
        budget: the request memory limits (``kserve_v2.request.budget``; the flags' defaults when None).
        offload: the pools heavy decoding and encoding run on (``kserve_v2.request.offload``; pools of its
            own when None), also ``offload`` for the REST routes.
        extensions: builds ``extensions`` from the manager, control mode, shared memory, trace and
            log settings (a replica among several builds ``kserve_v2.workers.replicated.ReplicatedExtensions``).
        cache: the response cache (``--cache-config``) of the models whose config enables it, or None.
    """

    def __init__(self, manager: ModelLifecycle, state: ServerState, server_name: str, control_mode: str,
                 metrics: InferenceMetrics | None = None, tracing: Tracing | None = None,
                 shared_memory: SharedMemoryRegistry | None = None, logs: LogSettings | None = None,
                 budget: MemoryBudget | None = None, offload: Offload | None = None,
                 extensions: ExtensionsFactory = TritonExtensions, cache: CountedCache | None = None) -> None:
        self._memory = shared_memory
        self._cache = cache
        self._budget = budget or MemoryBudget(Settings.max_request_decoded_bytes, Settings.request_memory_pool_bytes)
        self._manager = manager
        self._tracing = tracing or Tracing(TraceConfig(), server_name)
        self._state = state
        self._server_name = server_name
        self._metrics = metrics
        self.offload = offload or Offload()
        self.extensions = extensions(manager, control_mode, shared_memory, self._tracing.settings,
                                     logs or LogSettings(0))
        self.text = TextModels(manager, self.run_version)
        manager.step_runner = self.model_infer_reported  # ensemble steps go through the one inference call
        manager.step_streamer = self.model_stream  # a decoupled step through the stream call
        self.calls = LocalCalls(self.model_infer_reported, self.model_stream,  # and so do the requests model code sends
                                self.extensions.repository_model_load, self.extensions.repository_model_unload,
                                self.model_ready)

    # ---- health and metadata -------------------------------------------------------------

    def is_ready(self) -> bool:
        """ServerReady and the grpc.health.v1 status."""
        state = self._state
        if not state.started or state.draining or state.failure:
            return False
        return not state.strict_readiness or self._manager.models_ready()  # the models are read only when they count

    @property
    def traces(self) -> bool:
        """Whether requests are traced (transports pass a carrier only then)."""
        return self._tracing.enabled

    def has_model(self, name: str) -> bool:
        """Whether ``name`` is a model this server has a record of (loaded, loading, failed or unloaded)."""
        return self._manager.knows(name)

    def stored_config(self, name: str) -> mc.ModelConfig | None:
        """A repository model's configuration whether or not it is loaded (see
        ``ModelLifecycle.stored_config``); None when the repository has no such model."""
        return self._manager.stored_config(name)

    def server_live(self, _: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=not self._state.failure)

    def server_ready(self, _: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.is_ready())

    def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._manager.is_ready(request.name, request.version))

    def server_metadata(self, _: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        extensions = EXTENSIONS + ((SHM_EXTENSION,) if self._memory is not None else ())
        return pb.ServerMetadataResponse(name=self._server_name, version=__version__, extensions=extensions)

    def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        """Name, versions (the requested one, or every READY one), platform and tensors.

        Raises:
            NotFound / Unavailable / InvalidInput: as ``ModelLifecycle.resolve``.
        """
        model = self._manager.resolve(request.name, request.version)
        versions = [model] if request.version else self._manager.ready_versions(request.name)
        spec = model.spec
        response = pb.ModelMetadataResponse(
            name=spec.name, versions=[str(v.version) for v in versions],
            platform=model.config.platform or model.config.backend
        )
        for tensors, out in ((spec.inputs, response.inputs), (spec.outputs, response.outputs)):
            for tensor in tensors:
                out.add(name=tensor.name, datatype=tensor.dtype.v2, shape=spec.api_shape(tensor))
        return response

    def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        """The completed configuration of a READY version.

        Raises:
            NotFound / Unavailable / InvalidInput: as ``ModelLifecycle.resolve``.
        """
        return pb.ModelConfigResponse(config=self._manager.resolve(request.name, request.version).config)

    async def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """Statistics of every READY version of every model, of one model, or of one version.

        Raises:
            NotFound / Unavailable / InvalidInput: an unknown model or version.
        """
        if not request.name:
            models = list(self._manager.all_ready_versions())
        elif request.version:
            models = [self._manager.resolve(request.name, request.version)]
        else:
            models = self._manager.ready_versions(request.name)
        return pb.ModelStatisticsResponse(model_stats=[m.stats.to_pb(m.name, m.version) for m in models])

    # ---- inference -----------------------------------------------------------------------

    async def model_infer_reported(self, request: InferRequest | pb.ModelInferRequest,
                                   carrier: Mapping[str, str] | None = None, api: str = V2_API,
                                   raw_outputs: bool = True, wire_bytes: int | None = None
                                   ) -> tuple[InferResponse, RequestReport]:
        """Run one inference request; also report where its time went and its trace id.

        Args:
            request: the request, as the wire codec decoded it (its raw entries views of the
                transport's buffer), or as a generated message (converted first).
            carrier: transport headers or metadata, for a W3C ``traceparent``.
            api: the API the request came through, for the per-API metrics: ``infer`` for V2;
                the semantic routes name theirs (``encode``, ``score``, ``extract``, ``embeddings``).
            raw_outputs: false: the response carries no ``raw_output_contents`` and the output
                arrays come back in ``RequestReport.outputs`` (for transports that send them
                from the arrays' buffers).
            wire_bytes: the size of the buffer the request was decoded from, where the transport
                holds one (gRPC); None: the raw entries' sizes count.

        Raises:
            Unavailable: version not ready -> UNAVAILABLE. (During a drain the transports turn
                away new requests; one they have admitted, even if it was still uploading when the
                drain began, runs to the end.)
            NotFound: unknown model or version -> NOT_FOUND.
            InvalidInput: any request check (see ``decode.decode_request``) -> INVALID_ARGUMENT.
            TooLarge: over the request memory limits (``kserve_v2.request.budget``) -> RESOURCE_EXHAUSTED.
            InternalError: ONNX Runtime failed to execute -> INTERNAL.
        """
        if isinstance(request, pb.ModelInferRequest):
            request = request_from_message(request)
        if not self._tracing.enabled:  # the common case: no span, no context managers
            model = self._manager.acquire_version(request.model_name, request.model_version)
            try:
                return await self._run(request, model, api, raw_outputs, wire_bytes)
            finally:
                model.release()
        with self._tracing.request("ModelInfer", carrier or {}, request.model_name) as traced:
            with self._manager.acquire(request.model_name, request.model_version) as model:
                return await self._traced(traced, request, model, api, raw_outputs, wire_bytes)

    async def run_version(self, model: ModelVersion, request: InferRequest | pb.ModelInferRequest,
                          carrier: Mapping[str, str] | None = None, api: str = V2_API, raw_outputs: bool = True,
                          wire_bytes: int | None = None) -> tuple[InferResponse, RequestReport]:
        """``model_infer_reported`` on a version the caller has resolved and holds (``hold``), whatever
        the request's model name and version say.

        Raises:
            As ``model_infer_reported``, but for the model's resolution.
        """
        if isinstance(request, pb.ModelInferRequest):
            request = request_from_message(request)
        if not self._tracing.enabled:
            return await self._run(request, model, api, raw_outputs, wire_bytes)
        with self._tracing.request("ModelInfer", carrier or {}, request.model_name) as traced:
            return await self._traced(traced, request, model, api, raw_outputs, wire_bytes)

    async def model_stream(self, request: InferRequest, wire_bytes: int | None = None
                           ) -> AsyncGenerator[Streamed, None]:
        """Every response to one request as it is sent (ModelStreamInfer, generate, BLS): one for most
        models, zero or many for a decoupled one (``kserve_v2.service.streaming``). ``wire_bytes``: as for
        ``model_infer_reported``.

        Raises:
            As ``model_infer_reported``, for a request that fails before its model responded.
        """
        async for item in stream_request(request, wire_bytes, self._manager.acquire_version, self.run_version,
                                         self._run):
            yield item

    async def _traced(self, traced: RequestTrace | None, request: InferRequest, model: ModelVersion, api: str,
                      raw_outputs: bool, wire_bytes: int | None) -> tuple[InferResponse, RequestReport]:
        """``_run``, with the request's trace (when the trace settings picked it) begun and ended around it."""
        if traced is not None:
            traced.begin(request, model, self._memory)
        response, report = await self._run(request, model, api, raw_outputs, wire_bytes)
        if traced is None:
            return response, report
        traced.end(response, {"compute_input": report.compute_input_ns, "queue": report.queue_ns,
                              "compute_infer": report.compute_infer_ns, "compute_output": report.compute_output_ns,
                              "total": report.total_ns}, report.outputs)
        return response, replace(report, trace_id=traced.trace_id)

    async def _run(self, request: InferRequest, model: ModelVersion, api: str, raw_outputs: bool,
                   wire_bytes: int | None, responses: ResponseStream | None = None
                   ) -> tuple[InferResponse, RequestReport]:
        """Run one request; ``responses``: where a decoupled model's go (the response is then empty)."""
        if model.decoupled and responses is None:  # refused before it counts, as Triton's front ends do
            raise Unsupported(DECOUPLED_ONCE)
        started = time.perf_counter_ns()
        metrics = self._metrics
        if metrics is not None:
            metrics.started(model.name, model.label)
        calls = self.calls
        if calls.loop is None:  # model code sends its requests onto this loop (kserve_v2.backend.local_calls)
            calls.loop = asyncio.get_running_loop()
        # the shared memory regions the request names stay held (not unregistered) until it is answered
        regions = self._memory.request() if self._memory is not None else None
        try:
            callers = CALLERS.get()  # the models waiting for this request, when model code sent it
            if callers:
                check_callers(callers, model.name, model.config)
            cost, elements = request_cost(request, regions is not None, wire_bytes)
            # a request that costs nothing here cannot fail the budget: no reservation to hold
            with self._budget.reserve(cost, model.name) if cost else _UNRESERVED:
                if cost and is_heavy(cost, elements):
                    decoded = await self.offload.in_thread(decode_request, request, model.spec, regions)
                else:
                    decoded = decode_request(request, model.spec, regions)
                decoded_at = time.perf_counter_ns()
                lookup = None
                if self._cache is not None and model.config.response_cache.enable:  # hits skip the scheduler
                    lookup = await self._cache.lookup(model.name, model.version, model.label, decoded)
                    if lookup.found is not None:
                        return await self._cached(request, model, api, raw_outputs, decoded, lookup, started)
                try:
                    execution, queue_ns, infer_ns = await model.scheduler.submit(
                        decoded.feeds, decoded.output_names, decoded.parameters, decoded.batch_size,
                        RequestContext(request.id, callers, responses, calls, decoded.parameters))
                except ServerError:
                    raise
                except Exception as err:
                    raise InternalError(f"{model.config.backend} execution failed for model '{model.name}': {err}") from err
                ran_at = time.perf_counter_ns()
                decoded.feeds.clear()  # the inputs' decoded copies are not needed to encode: free them first
                if execution.names is not None:  # outputs its model did not make are left out (Triton)
                    decoded, lookup = decoded.keeping(execution.names), None  # and the partial answer is not cached
                arrays: list[np.ndarray]
                if responses is not None and responses.taken:  # its responses went to the stream
                    response, arrays = InferResponse(model.name, str(model.version), request.id), []
                # without raw contents or shared memory, encoding only describes the outputs: nothing heavy
                elif (raw_outputs or decoded.output_memory) and _heavy(execution.outputs):
                    response, arrays = await self.offload.in_thread(encode_response, request, model.spec,
                                                                    model.version, decoded, execution.outputs,
                                                                    raw_outputs, execution.parameters)
                else:
                    response, arrays = encode_response(request, model.spec, model.version, decoded, execution.outputs,
                                                       raw_outputs, execution.parameters)
        except BaseException as err:
            elapsed = time.perf_counter_ns() - started
            model.stats.record_failure(elapsed)
            if metrics is not None:
                metrics.failed(model.name, model.label, api, failure_code(err), elapsed)
            raise
        finally:
            if regions is not None:
                regions.release()
        miss_ns = None
        if lookup is not None and self._cache is not None and not (responses is not None and responses.taken):
            miss_ns = await self._cache.insert(lookup, model.name, model.label, execution.outputs, execution.parameters)
        finished = time.perf_counter_ns()
        report = RequestReport(decoded.batch_size, execution.executions, execution.batch_size, finished - started,
                               queue_ns, decoded_at - started + execution.pre_ns, infer_ns,
                               finished - ran_at + execution.post_ns, execution.tokens,
                               outputs=() if raw_outputs else tuple(arrays))
        model.stats.record_success(report)
        if miss_ns is not None:
            model.stats.record_cache_miss(miss_ns)
        if metrics is not None:
            metrics.succeeded(model.name, model.label, api, report)
        # log_verbose_level > 0 (Triton's verbose log): a line per request; one level check otherwise
        log.debug("%s request for model '%s' version %s: batch size %d, %.3f ms (queue %.3f ms)", api, model.name,
                  model.label, decoded.batch_size, report.total_ns / 1e6, report.queue_ns / 1e6)
        return response, report

    async def _cached(self, request: InferRequest, model: ModelVersion, api: str, raw_outputs: bool,
                      decoded: DecodedRequest, lookup: Lookup, started: int) -> tuple[InferResponse, RequestReport]:
        """Answer a request from the response cache (``kserve_v2.service.response_cache``): its response is
        encoded from the cached outputs as the model's would be; it counts as Triton counts a hit (a
        success with its hashing as queue time and its lookup as ``cache_hit``; no inference, execution
        or compute phase)."""
        assert lookup.found is not None and self._cache is not None
        decoded.feeds.clear()
        building = time.perf_counter_ns()
        outputs, parameters = lookup.found.outputs, lookup.found.parameters
        if (raw_outputs or decoded.output_memory) and _heavy(outputs):
            response, arrays = await self.offload.in_thread(encode_response, request, model.spec, model.version,
                                                            decoded, list(outputs), raw_outputs, parameters)
        else:
            response, arrays = encode_response(request, model.spec, model.version, decoded, list(outputs),
                                               raw_outputs, parameters)
        finished = time.perf_counter_ns()
        hit_ns = lookup.lookup_ns + finished - building
        report = RequestReport(decoded.batch_size, 0, 0, finished - started, lookup.hash_ns, 0, 0, 0,
                               outputs=() if raw_outputs else tuple(arrays))
        model.stats.record_cache_hit(report.total_ns, report.queue_ns, hit_ns)
        self._cache.record_hit(model.name, model.label, hit_ns)
        if self._metrics is not None:  # a hit is a success, but no inference (Triton's nv_inference_count)
            self._metrics.succeeded(model.name, model.label, api, replace(report, batch_size=0))
        return response, report


def _heavy(arrays: list[np.ndarray]) -> bool:
    """Whether encoding these outputs leaves the event loop (``kserve_v2.request.offload``)."""
    nbytes = elements = 0
    for array in arrays:
        nbytes += array.nbytes
        if array.dtype.hasobject:
            elements += array.size
    return is_heavy(nbytes, elements)


def failure_code(err: BaseException) -> ErrorCode:
    """The error class a failed request is counted under (Triton's failure reasons in metrics): a
    ``ServerError``'s own; CANCELLED only for a request that was cancelled (its caller went away or
    its deadline passed); INTERNAL for anything else, as its transport reports it."""
    if isinstance(err, ServerError):
        return err.code
    return ErrorCode.CANCELLED if isinstance(err, asyncio.CancelledError) else ErrorCode.INTERNAL
