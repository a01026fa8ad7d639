"""Triton's extensions beside inference, as transport-free calls: the model repository (index,
load, unload), system and CUDA shared memory, trace settings and log settings (Triton's
``docs/protocol`` extensions). Their audience is an operator or a client managing the server;
``InferenceService`` keeps the inference RPCs, and the transports call these with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.models.lifecycle import ModelLifecycle
from kserve_v2.observability.log_settings import LogSettings
from kserve_v2.observability.trace_settings import TraceSettings
from kserve_v2.protocol.errors import InvalidInput, NotFound, Unavailable
from kserve_v2.request.shared_memory import SharedMemoryRegistry


class TritonExtensions:
    """The repository, shared memory, trace and logging RPCs of Triton's GRPCInferenceService.

    Args:
        manager: the model lifecycle (the repository's ``ModelManager``, handed in by ``kserve_v2.app``).
        control_mode: model control mode; only ``explicit`` allows load and unload RPCs.
        shared_memory: registered system shared memory regions, or None when client shared
            memory is off (``--allow-client-shm``).
        traces: the trace settings of Triton's trace extension.
        logs: the log settings of Triton's logging extension.
    """

    def __init__(self, manager: ModelLifecycle, control_mode: str, shared_memory: SharedMemoryRegistry | None,
                 traces: TraceSettings, logs: LogSettings) -> None:
        self._manager = manager
        self._control_mode = control_mode
        self._memory = shared_memory
        self._traces = traces
        self._logs = logs

    # ---- model repository ----------------------------------------------------------------

    async def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        """Every model folder with its versions' states and reasons (``ready`` filters)."""
        response = pb.RepositoryIndexResponse()
        await self._manager.refresh()
        for row in self._manager.index(request.ready):
            response.models.add(name=row.name, version=row.version, state=row.state, reason=row.reason)
        return response

    async def repository_model_load(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        """Load, or reload, a model (``config`` and ``file:`` parameters as Triton takes them).

        Raises:
            Unavailable: control mode is not explicit (Triton's answer) -> UNAVAILABLE.
            InvalidInput: unsafe name or file path, unknown parameter, or a failed load (Triton's
                "load failed for model '<m>': version <v> is at UNAVAILABLE state: <reason>;") -> INVALID_ARGUMENT.
            InternalError: unknown model, ``file:`` overrides that cannot be written, or a ``config`` that
                is not ModelConfig JSON ("failed to load '<m>', failed to poll from model repository") -> INTERNAL.
        """
        self.require_explicit()
        await self._manager.load_requested(requested_model(request), request.parameters)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(self, request: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        """Unload a model after its in-flight requests finish; with ``unload_dependents`` true, an
        ensemble's composing models that no other ensemble uses too (Triton's model repository extension).

        Raises:
            Unavailable: control mode is not explicit (Triton's answer) -> UNAVAILABLE.
            InvalidInput: an unknown parameter -> INVALID_ARGUMENT.
        """
        self.require_explicit()
        for key, value in request.parameters.items():
            if key != "unload_dependents" or value.WhichOneof("parameter_choice") != "bool_param":
                raise InvalidInput(f"Unrecognized unload parameter '{key}'")
        dependents = "unload_dependents" in request.parameters and request.parameters["unload_dependents"].bool_param
        if dependents:
            await self._manager.unload_with_composing(requested_model(request))
        else:
            await self._manager.unload(requested_model(request))
        return pb.RepositoryModelUnloadResponse()

    def require_explicit(self) -> None:
        """Refuse model control outside explicit mode.

        Raises:
            Unavailable: Triton's text, in modes none and poll alike -> UNAVAILABLE.
        """
        if self._control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    # ---- system shared memory (Triton's extension) -------------------------------------------

    async def system_shared_memory_register(self, request: pb.SystemSharedMemoryRegisterRequest
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

    async def system_shared_memory_unregister(self, request: pb.SystemSharedMemoryUnregisterRequest
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

    async def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        """Update (when settings are given) and answer the global or a model's trace settings
        (Triton's trace extension, ``TraceSettings``).

        Raises:
            InvalidInput: a model that is not ready ("Request for unknown model : <m>"), or a value
                Triton would not parse -> INVALID_ARGUMENT / 400.
            Unsupported: ``trace_file`` -> UNIMPLEMENTED / 501.
        """
        if request.model_name and not self._manager.is_ready(request.model_name, ""):
            raise InvalidInput(f"Request for unknown model : {request.model_name}")
        settings = self._traces
        if request.settings:
            settings.update(request.model_name, {k: list(v.value) for k, v in request.settings.items()})
        response = pb.TraceSettingResponse()
        for name, value in settings.current(request.model_name).items():
            response.settings[name].value.extend(value if isinstance(value, tuple) else [value])
        return response

    async def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
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


def requested_model(request: pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest) -> str:
    """The model name; KServe's proto puts it in field 1 (Triton's repository_name) with no parameters."""
    if not request.model_name and request.repository_name and not request.parameters:
        return request.repository_name
    return request.model_name


# builds the extensions of a service: (manager, control mode, shared memory, trace settings, log settings)
ExtensionsFactory = Callable[[ModelLifecycle, str, SharedMemoryRegistry | None, TraceSettings, LogSettings],
                             TritonExtensions]
