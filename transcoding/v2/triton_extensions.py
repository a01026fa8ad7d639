"""REST routes of Triton's trace, logging and CUDA shared memory extensions: transcoders only.

Each route turns the HTTP request into the protobuf request of the gRPC RPC (``TraceSetting``,
``LogSettings``, ``CudaSharedMemory*``), calls the same ``InferenceService`` method, and renders
the answer as Triton's JSON (``extension_trace.md``, ``extension_logging.md``,
``extension_shared_memory.md`` in Triton's ``docs/protocol``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.json_pb import message_to_json
from kserve_v2.service.inference_service import InferenceService
from transcoding.http.body import read_body
from transcoding.http.json_io import load_json

Handler = Callable[[Request], Awaitable[Response]]


def extension_routes(service: InferenceService, max_input_bytes: int, wrap: Callable[[Handler], Handler]) -> list[Route]:
    """The routes; ``wrap`` turns a handler's exceptions into Triton's ``{"error"}`` answers."""

    async def body_object(request: Request) -> dict[str, Any]:
        body = load_json(await read_body(request, max_input_bytes)) if request.method == "POST" else {}
        if body in ("", None):
            return {}
        if not isinstance(body, dict):
            raise InvalidInput("the request body must be a JSON object")
        return body

    async def trace(request: Request) -> Response:
        message = pb.TraceSettingRequest(model_name=request.path_params.get("model", ""))
        for name, value in (await body_object(request)).items():
            message.settings[name].value.extend(_trace_values(name, value))
        answer = await service.extensions.trace_setting(message)
        return JSONResponse({name: list(v.value) if name == "trace_level" else (v.value[0] if v.value else "")
                             for name, v in answer.settings.items()})

    async def logging(request: Request) -> Response:
        message = pb.LogSettingsRequest()
        for name, value in (await body_object(request)).items():
            if value is not None:  # Triton skips null settings
                _log_value(message.settings[name], name, value)
        answer = await service.extensions.log_settings(message)
        return JSONResponse({name: getattr(v, v.WhichOneof("parameter_choice")) for name, v in answer.settings.items()})

    async def cuda_status(request: Request) -> Response:
        status = service.extensions.cuda_shared_memory_status(pb.CudaSharedMemoryStatusRequest(
            name=request.path_params.get("region", "")))
        return JSONResponse([message_to_json(region) for region in status.regions.values()])

    async def cuda_register(request: Request) -> Response:
        body = await body_object(request)
        handle = body.get("raw_handle")
        if not isinstance(handle, dict) or not isinstance(handle.get("b64"), str):
            raise InvalidInput("Shared memory register request has no 'raw_handle' field")
        try:
            raw = base64.b64decode(handle["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t") from None
        numbers = {key: body.get(key, 0) for key in ("device_id", "byte_size")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in numbers.values()):
            raise InvalidInput("'device_id' and 'byte_size' must be unsigned integers")
        service.extensions.cuda_shared_memory_register(pb.CudaSharedMemoryRegisterRequest(
            name=request.path_params["region"], raw_handle=raw, **numbers))
        return JSONResponse({})

    async def cuda_unregister(request: Request) -> Response:
        service.extensions.cuda_shared_memory_unregister(pb.CudaSharedMemoryUnregisterRequest(
            name=request.path_params.get("region", "")))
        return JSONResponse({})

    both = ["GET", "POST"]
    routes = [Route("/v2/trace/setting", wrap(trace), methods=both),
              Route("/v2/logging", wrap(logging), methods=both),
              Route("/v2/cudasharedmemory/status", wrap(cuda_status), methods=["GET"]),
              Route("/v2/cudasharedmemory/region/{region}/status", wrap(cuda_status), methods=["GET"]),
              Route("/v2/cudasharedmemory/region/{region}/register", wrap(cuda_register), methods=["POST"]),
              Route("/v2/cudasharedmemory/unregister", wrap(cuda_unregister), methods=["POST"]),
              Route("/v2/cudasharedmemory/region/{region}/unregister", wrap(cuda_unregister), methods=["POST"])]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes.append(Route(prefix + "/trace/setting", wrap(trace), methods=both))
    return routes


def _trace_values(name: str, value: Any) -> list[str]:
    """A JSON trace setting as the gRPC value list: null clears, a string or number is one value."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, int) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise InvalidInput(f"trace setting '{name}' must be a string, a list of strings, or null")


def _log_value(target: pb.LogSettingsRequest.SettingValue, name: str, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int) and 0 <= value < 2**32:
        target.uint32_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        raise InvalidInput(f"log setting '{name}' must be a boolean, an unsigned 32-bit integer or a string")
