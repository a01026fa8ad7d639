"""InferenceService: protobuf in, protobuf out, for every V2 RPC. The one request path.

The gRPC servicer delegates here method by method; the REST and semantic front ends will
transcode into the same calls. Nothing here imports a transport.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from kserve_v2 import __version__, backend
from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.budget import MemoryBudget, request_cost
from kserve_v2.datatypes import BYTES
from kserve_v2.errors import ErrorCode, InternalError, InvalidInput, NotFound, NotLoaded, ServerError, Unavailable
from kserve_v2.inference import Buffer, decode_request
from kserve_v2.responses import encode_response
from kserve_v2.lifecycle import ModelLifecycle
from kserve_v2.log_settings import LogSettings
from kserve_v2.metrics import V2_API, InferenceMetrics
from kserve_v2.model import ModelVersion
from kserve_v2.offload import in_thread, is_heavy
from kserve_v2.settings import Settings
from kserve_v2.shared_memory import SharedMemoryRegistry
from kserve_v2.tensors import pack_bytes
from kserve_v2.text import NOT_TEXT, OutputKind, TextCall, TextContract, TextModelInfo
from kserve_v2.trace_config import TraceConfig
from kserve_v2.tracing import Tracing

log = logging.getLogger(__name__)

# Extensions this server implements (Triton's names, ServerMetadata.extensions).
EXTENSIONS = ("classification", "model_repository", "model_repository(unload_dependents)", "model_configuration",
              "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics", "sequence", "trace", "logging")
SHM_EXTENSION = "system_shared_memory"
_UNRESERVED = nullcontext()


@dataclass(slots=True)
class RequestReport:
    """Where one request's time went (ns, the phases of ModelStatistics), the tokens a text model
    processed, the trace id (or None), and the output arrays when asked for (``raw_outputs=False``).

    Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, which costs
    microseconds per request; callers only read it."""

    total_ns: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    tokens: int = 0
    trace_id: str | None = None
    outputs: tuple[np.ndarray, ...] = ()  # the output arrays, when the caller takes them instead of raw contents


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
    """Every RPC of GRPCInferenceService as a transport-free coroutine or function.

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
        budget: the request memory limits (``kserve_v2.budget``; the flags' defaults when None).
    """

    def __init__(self, manager: ModelLifecycle, state: ServerState, server_name: str, control_mode: str,
                 metrics: InferenceMetrics | None = None, tracing: Tracing | None = None,
                 shared_memory: SharedMemoryRegistry | None = None, logs: LogSettings | None = None,
                 budget: MemoryBudget | None = None) -> None:
        self._memory = shared_memory
        self._logs = logs or LogSettings(0)
        self._budget = budget or MemoryBudget(Settings.max_request_decoded_bytes, Settings.request_memory_pool_bytes)
        self._manager = manager
        self._tracing = tracing or Tracing(TraceConfig(), server_name)
        self._state = state
        self._server_name = server_name
        self._control_mode = control_mode
        self._metrics = metrics
        manager.step_runner = self.model_infer  # ensemble steps go through the one inference call

    # ---- health and metadata -------------------------------------------------------------

    def is_ready(self) -> bool:
        """ServerReady and the grpc.health.v1 status."""
        state = self._state
        if not state.started or state.draining or state.failure:
            return False
        return self._manager.startup_models_ready() or not state.strict_readiness

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

    def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
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

    async def model_infer(self, request: pb.ModelInferRequest, carrier: Mapping[str, str] | None = None,
                          wire_bytes: int | None = None) -> pb.ModelInferResponse:
        """Run one inference request (see ``model_infer_reported``)."""
        response, _ = await self.model_infer_reported(request, carrier, wire_bytes=wire_bytes)
        return response

    async def model_infer_reported(self, request: pb.ModelInferRequest, carrier: Mapping[str, str] | None = None,
                                   api: str = V2_API, raw_inputs: Sequence[Buffer] | None = None,
                                   raw_outputs: bool = True, wire_bytes: int | None = None
                                   ) -> tuple[pb.ModelInferResponse, RequestReport]:
        """Run one inference request; also report where its time went and its trace id.

        Args:
            request: the request.
            carrier: transport headers or metadata, for a W3C ``traceparent``.
            api: the API the request came through, for the per-API metrics: ``infer`` for V2;
                the semantic routes name theirs (``encode``, ``score``, ``extract``, ``embeddings``).
            raw_inputs: the ``raw_input_contents`` entries kept beside the message (no copy into
                it); None: the message's own.
            raw_outputs: false: the response carries no ``raw_output_contents`` and the output
                arrays come back in ``RequestReport.outputs`` (for transports that send them
                from the arrays' buffers).
            wire_bytes: the request's serialized size where the transport knows it (gRPC: the
                message received); None: measured with ``ByteSize``, which for upb means
                serializing the message once more.

        Raises:
            Unavailable: version not ready -> UNAVAILABLE. (During a drain the transports turn
                away new requests; one they have admitted, even if it was still uploading when the
                drain began, runs to the end.)
            NotFound: unknown model or version -> NOT_FOUND.
            InvalidInput: any request check (see ``inference.decode_request``) -> INVALID_ARGUMENT.
            TooLarge: over the request memory limits (``kserve_v2.budget``) -> RESOURCE_EXHAUSTED.
            InternalError: ONNX Runtime failed to execute -> INTERNAL.
        """
        if not self._tracing.enabled:  # the common case: no span, no context managers
            model = self._manager.acquire_version(request.model_name, request.model_version)
            try:
                return await self._run(request, model, api, raw_inputs, raw_outputs, wire_bytes)
            finally:
                model.release()
        with self._tracing.request("ModelInfer", carrier or {}, request.model_name) as traced:
            with self._manager.acquire(request.model_name, request.model_version) as model:
                if traced is not None:
                    traced.begin(request, model, self._memory, raw_inputs)
                response, report = await self._run(request, model, api, raw_inputs, raw_outputs, wire_bytes)
            if traced is None:
                return response, report
            traced.end(response, {"compute_input": report.compute_input_ns, "queue": report.queue_ns,
                                  "compute_infer": report.compute_infer_ns, "compute_output": report.compute_output_ns,
                                  "total": report.total_ns}, report.outputs)
            return response, replace(report, trace_id=traced.trace_id)

    async def _run(self, request: pb.ModelInferRequest, model: ModelVersion, api: str,
                   raw_inputs: Sequence[Buffer] | None, raw_outputs: bool, wire_bytes: int | None
                   ) -> tuple[pb.ModelInferResponse, RequestReport]:
        started = time.perf_counter_ns()
        metrics = self._metrics
        if metrics is not None:
            metrics.started(model.name, model.label)
        # the shared memory regions the request names stay held (not unregistered) until it is answered
        regions = self._memory.request() if self._memory is not None else None
        try:
            cost, elements = request_cost(request, regions is not None, raw_inputs, wire_bytes)
            # a request that costs nothing here cannot fail the budget: no reservation to hold
            with self._budget.reserve(cost, model.name) if cost else _UNRESERVED:
                if cost and is_heavy(cost, elements):
                    decoded = await in_thread(decode_request, request, model.spec, regions, raw_inputs)
                else:
                    decoded = decode_request(request, model.spec, regions, raw_inputs)
                decoded_at = time.perf_counter_ns()
                try:
                    execution, queue_ns, infer_ns = await model.scheduler.submit(
                        decoded.feeds, decoded.output_names, decoded.parameters, decoded.batch_size)
                except ServerError:
                    raise
                except Exception as err:
                    raise InternalError(f"{model.config.backend} execution failed for model '{model.name}': {err}") from err
                ran_at = time.perf_counter_ns()
                decoded.feeds.clear()  # the inputs' decoded copies are not needed to encode: free them first
                # without raw contents or shared memory, encoding only describes the outputs: nothing heavy
                if (raw_outputs or decoded.output_memory) and _heavy(execution.outputs):
                    response, arrays = await in_thread(encode_response, request, model.spec, model.version,
                                                       decoded, execution.outputs, raw_outputs, execution.parameters)
                else:
                    response, arrays = encode_response(request, model.spec, model.version, decoded, execution.outputs,
                                                       raw_outputs, execution.parameters)
        except BaseException as err:
            elapsed = time.perf_counter_ns() - started
            model.stats.record_failure(elapsed)
            if metrics is not None:
                code = err.code if isinstance(err, ServerError) else ErrorCode.CANCELLED
                metrics.failed(model.name, model.label, api, code, elapsed)
            raise
        finally:
            if regions is not None:
                regions.release()
        finished = time.perf_counter_ns()
        total_ns, input_ns, output_ns = finished - started, decoded_at - started + execution.pre_ns, \
            finished - ran_at + execution.post_ns
        model.stats.record_success(decoded.batch_size, execution.executions, total_ns, queue_ns, input_ns, infer_ns,
                                   output_ns, execution.batch_size)
        if metrics is not None:
            metrics.succeeded(model.name, model.label, api, decoded.batch_size, execution.executions,
                              execution.tokens, total_ns, queue_ns, input_ns, infer_ns, output_ns)
        # log_verbose_level > 0 (Triton's verbose log): a line per request; one level check otherwise
        log.debug("%s request for model '%s' version %s: batch size %d, %.3f ms (queue %.3f ms)", api, model.name,
                  model.label, decoded.batch_size, total_ns / 1e6, queue_ns / 1e6)
        return response, RequestReport(total_ns, queue_ns, input_ns, infer_ns, output_ns, execution.tokens,
                                       outputs=() if raw_outputs else tuple(arrays))

    # ---- text models: the semantic routes' calls (``kserve_v2.text``) ---------------------

    def text_models(self) -> list[TextModelInfo]:
        """Every text model of the repository, loaded or not, by name."""
        names = dict.fromkeys(row.name for row in self._manager.index(False))
        return [info for info in map(self._text_info, names) if info.kinds]

    def text_model(self, name: str) -> TextModelInfo:
        """The model named ``name`` (its repository name or its ``alias``), loaded or not, as a
        text model (no ``kinds`` when it is not one).

        Raises:
            NotFound: no such model -> NOT_FOUND / 404.
        """
        return self._text_info(self._text_name(name))

    async def text_infer(self, name: str, call: TextCall, carrier: Mapping[str, str] | None = None,
                         api: str = V2_API) -> tuple[dict[str, np.ndarray], RequestReport]:
        """One execution of a text model, planned by the route from the model's contract: the name
        resolved (``call.resolved``), the contract of its READY version read, the request built
        (``call.plan``) and run as ``model_infer_reported`` runs a V2 request.

        Returns:
            (V2 output name -> array, for the requested outputs; the report).

        Raises:
            NotFound: no model by that name or alias -> NOT_FOUND / 404.
            NotLoaded: no READY version -> UNAVAILABLE / 503 (SIE's MODEL_NOT_LOADED).
            Whatever ``call.plan`` and ``model_infer_reported`` raise.
        """
        resolved = self._text_name(name)
        call.resolved(resolved)
        try:
            contract = self._manager.resolve(resolved, "").text or NOT_TEXT
        except NotFound as err:
            raise NotLoaded(f"Model '{resolved}' is not loaded: {err}") from None
        planned = call.plan(resolved, contract)
        message = pb.ModelInferRequest(model_name=resolved)
        for kind, values in planned.texts.items():
            message.inputs.add(name=kind.value, datatype=BYTES.v2, shape=[len(values)])
            message.raw_input_contents.append(pack_bytes(np.array(values, dtype=object)))
        for output in planned.outputs:
            message.outputs.add(name=output)
        for key, value in planned.parameters.items():
            message.parameters[key].string_param = value
        response, report = await self.model_infer_reported(message, carrier, api, raw_outputs=False)
        return {tensor.name: array for tensor, array in zip(response.outputs, report.outputs, strict=True)}, report

    def _text_name(self, name: str) -> str:
        """The repository name of ``name``: itself, or the model whose ``alias`` parameter it is.

        Raises:
            NotFound: "Model '<name>' not found" -> NOT_FOUND / 404.
        """
        if self._manager.knows(name) or self._manager.stored_config(name) is not None:
            return name
        for stored, config in self._manager.stored_configs():
            if "alias" in config.parameters and config.parameters["alias"].string_value == name:
                return stored
        raise NotFound(f"Model '{name}' not found")

    def _text_info(self, name: str) -> TextModelInfo:
        """A repository model as a text model: a READY version's contract, else what its backend
        declares (no ``kinds`` when it is not a text model)."""
        config = self._manager.stored_config(name)
        try:
            contract: TextContract | None = self._manager.resolve(name, "").text or NOT_TEXT
        except ServerError:
            contract = None
        kinds: tuple[OutputKind, ...] = ()
        if contract is not None:
            kinds = tuple(contract.kinds())
        elif config is not None and (found := backend.find(config.backend)) is not None:
            kinds = found.offers
        parameters = config.parameters if config is not None else {}
        aliases = (parameters["alias"].string_value,) if "alias" in parameters else ()
        length = (contract.max_sequence_length if contract is not None else
                  int(parameters["max_sequence_length"].string_value or 0) if "max_sequence_length" in parameters else 0)
        return TextModelInfo(name, aliases, kinds, contract, length)

    # ---- model repository ----------------------------------------------------------------

    def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        """Every model folder with its versions' states and reasons (``ready`` filters)."""
        response = pb.RepositoryIndexResponse()
        for row in self._manager.index(request.ready):
            response.models.add(name=row.name, version=row.version, state=row.state, reason=row.reason)
        return response

    async def repository_model_load(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        """Load, or reload, a model (``config`` and ``file:`` parameters as Triton takes them).

        Raises:
            Unavailable: control mode is not explicit (Triton's answer) -> UNAVAILABLE.
            InvalidInput: unsafe name or file path, unknown parameter, or a failed load (Triton's
                "load failed for model '<m>': version <v> is at UNAVAILABLE state: <reason>;") -> INVALID_ARGUMENT.
            InternalError: unknown model, or ``file:`` overrides that cannot be written ("failed to load
                '<m>', failed to poll from model repository") -> INTERNAL.
        """
        self._require_explicit()
        await self._manager.load_requested(_model_name(request), request.parameters)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(self, request: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        """Unload a model after its in-flight requests finish; with ``unload_dependents`` true, an
        ensemble's composing models that no other ensemble uses too (Triton's model repository extension).

        Raises:
            Unavailable: control mode is not explicit (Triton's answer) -> UNAVAILABLE.
            InvalidInput: an unknown parameter -> INVALID_ARGUMENT.
        """
        self._require_explicit()
        for key, value in request.parameters.items():
            if key != "unload_dependents" or value.WhichOneof("parameter_choice") != "bool_param":
                raise InvalidInput(f"Unrecognized unload parameter '{key}'")
        dependents = "unload_dependents" in request.parameters and request.parameters["unload_dependents"].bool_param
        if dependents:
            await self._manager.unload_with_composing(_model_name(request))
        else:
            await self._manager.unload(_model_name(request))
        return pb.RepositoryModelUnloadResponse()

    def _require_explicit(self) -> None:
        if self._control_mode != "explicit":  # Triton's text in modes none and poll alike
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    # ---- system shared memory (Triton's extension) -------------------------------------------

    def system_shared_memory_register(self, request: pb.SystemSharedMemoryRegisterRequest
                                      ) -> pb.SystemSharedMemoryRegisterResponse:
        """Register a region (see ``SharedMemoryRegistry.register``).

        Raises:
            InvalidInput: client shared memory is off, an empty name, or a range beyond the object -> INVALID_ARGUMENT.
            InternalError: a key that cannot be opened -> INTERNAL (Triton's text).
            AlreadyExists: the name is taken -> ALREADY_EXISTS.
        """
        if self._memory is None:
            raise InvalidInput("Client shared memory is disabled: start the server with --allow-client-shm true")
        self._memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def system_shared_memory_status(self, request: pb.SystemSharedMemoryStatusRequest
                                    ) -> pb.SystemSharedMemoryStatusResponse:
        """Every registered region, or one (none while client shared memory is off).

        Raises:
            NotFound: an unknown region name -> NOT_FOUND.
        """
        response = pb.SystemSharedMemoryStatusResponse()
        if self._memory is None:
            if request.name:
                raise NotFound(f"Unable to find system shared memory region: '{request.name}'")
            return response
        for region in self._memory.status(request.name):
            response.regions[region.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size))
        return response

    def system_shared_memory_unregister(self, request: pb.SystemSharedMemoryUnregisterRequest
                                        ) -> pb.SystemSharedMemoryUnregisterResponse:
        """Forget a region, or all of them (empty name).

        Raises:
            InternalError: a region held by a request in flight (``SharedMemoryRegistry.unregister``,
                Triton's texts) -> INTERNAL.
        """
        if self._memory is not None:
            self._memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    # ---- Triton's CUDA shared memory, trace and logging extensions ----------------------------

    def cuda_shared_memory_status(self, request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        """No CUDA region is ever registered (see ``cuda_shared_memory_register``): an empty list.

        Raises:
            NotFound: a named region, with Triton's texts -> NOT_FOUND / 404.
        """
        if request.name and self._memory is not None and any(r.name == request.name for r in self._memory.status("")):
            raise NotFound(f"The region named '{request.name}' is registered as system shared memory, "
                           "not CUDA shared memory")
        if request.name:
            raise NotFound(f"Unable to find system shared memory region: '{request.name}'")
        return pb.CudaSharedMemoryStatusResponse()

    def cuda_shared_memory_register(self, request: pb.CudaSharedMemoryRegisterRequest
                                    ) -> pb.CudaSharedMemoryRegisterResponse:
        """CUDA IPC regions are not supported: Triton's answer on a build without GPU support.

        Raises:
            InvalidInput: always, "failed to register CUDA shared memory region: '<r>', GPUs not
                supported" -> INVALID_ARGUMENT / 400.
        """
        raise InvalidInput(f"failed to register CUDA shared memory region: '{request.name}', GPUs not supported")

    def cuda_shared_memory_unregister(self, _: pb.CudaSharedMemoryUnregisterRequest
                                      ) -> pb.CudaSharedMemoryUnregisterResponse:
        """Unregister one CUDA region or all of them: nothing is registered, so it succeeds (Triton)."""
        return pb.CudaSharedMemoryUnregisterResponse()

    def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        """Update (when settings are given) and answer the global or a model's trace settings
        (Triton's trace extension, ``TraceSettings``).

        Raises:
            InvalidInput: a model that is not ready ("Request for unknown model : <m>"), or a value
                Triton would not parse -> INVALID_ARGUMENT / 400.
            Unsupported: ``trace_file`` -> UNIMPLEMENTED / 501.
        """
        if request.model_name and not self._manager.is_ready(request.model_name, ""):
            raise InvalidInput(f"Request for unknown model : {request.model_name}")
        settings = self._tracing.settings
        if request.settings:
            settings.update(request.model_name, {k: list(v.value) for k, v in request.settings.items()})
        response = pb.TraceSettingResponse()
        for name, value in settings.current(request.model_name).items():
            response.settings[name].value.extend(value if isinstance(value, tuple) else [value])
        return response

    def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        """Update (when settings are given) and answer the log settings (Triton's logging
        extension, ``LogSettings``).

        Raises:
            InvalidInput: a value of the wrong type -> INVALID_ARGUMENT / 400.
            Unsupported: ``log_file`` -> UNIMPLEMENTED / 501.
            Unavailable: an unknown ``log_format`` (Triton's code) -> UNAVAILABLE / 503.
        """
        values = {key: getattr(value, choice) for key, value in request.settings.items()
                  if (choice := value.WhichOneof("parameter_choice")) is not None}
        if values:
            self._logs.update(values)
        response = pb.LogSettingsResponse()
        for name, value in self._logs.current().items():
            kind = "bool_param" if isinstance(value, bool) else "uint32_param" if isinstance(value, int) else "string_param"
            setattr(response.settings[name], kind, value)
        return response


def _heavy(arrays: list[np.ndarray]) -> bool:
    """Whether encoding these outputs leaves the event loop (``kserve_v2.offload``)."""
    nbytes = elements = 0
    for array in arrays:
        nbytes += array.nbytes
        if array.dtype.hasobject:
            elements += array.size
    return is_heavy(nbytes, elements)


def _model_name(request: pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest) -> str:
    """The model name; KServe's proto puts it in field 1 (Triton's repository_name) with no parameters."""
    if not request.model_name and request.repository_name and not request.parameters:
        return request.repository_name
    return request.model_name
