"""REST on the V2 HTTP protocol with Triton's extensions: every route is a transcoder.

A route parses HTTP into the protobuf request the gRPC servicer would receive, calls the same
``InferenceService`` method, and renders its protobuf response as JSON (KServe's Open Inference Protocol, REST; Triton's
``docs/protocol`` extensions). Errors come from the one table in ``http.status``. The application
serving these routes with the others is built in ``transcoding.app``.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec.messages import Buffer, InferRequest, InferResponse, RequestHeader
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.json_pb import message_to_json
from kserve_v2.request.forwarded_headers import forwarded
from kserve_v2.request.offload import is_heavy
from kserve_v2.service.inference_service import InferenceService
from transcoding.http.body import compressed, header_values, read_body
from transcoding.http.json_io import load_json
from transcoding.http.routes import Handler, guarded
from transcoding.http.status import error_response
from transcoding.v2.generate import generate_routes
from transcoding.v2.json_tensors import (HttpInfer, detached, parse_detached, parse_infer_request,
                                     render_detached, render_infer_response)
from transcoding.http.timing import timing_pairs
from transcoding.v2.raw_binary import raw_binary_request
from transcoding.v2.triton_extensions import extension_routes

HEADER_LENGTH = "inference-header-content-length"
_HEADER_LENGTH = HEADER_LENGTH.encode()
_JSON, _OCTETS = b"application/json", b"application/octet-stream"


class V2Routes:
    """The handlers of the V2 REST routes (KServe's Open Inference Protocol, REST, and Triton's
    extensions) on one service: each parses HTTP into the protobuf request, calls the
    ``InferenceService`` method gRPC calls, and renders its answer as JSON. Errors are V2's
    ``{"error"}`` envelope (``v2_error``).

    Args:
        service: the one request path.
        max_input_bytes: largest request body, after decompression (413 above it).
        header_forward: Triton's ``--http-header-forward-pattern``: the headers whose name it finds
            become string parameters of an infer request (``kserve_v2.request.forwarded_headers``).
    """

    def __init__(self, service: InferenceService, max_input_bytes: int,
                 header_forward: re.Pattern[str] | None = None) -> None:
        self.service = service
        self.max_input_bytes = max_input_bytes
        self.header_forward = header_forward

    def routes(self) -> list[BaseRoute]:
        """Health, metadata, config, statistics, infer, generate, repository and system shared memory routes."""
        def v2(handler: Handler) -> Handler:
            return guarded(handler, v2_error)

        routes: list[BaseRoute] = [
            Route("/", v2(self.live), methods=["GET"]),
            Route("/v2", v2(self.server_metadata), methods=["GET"]),
            Route("/v2/health/live", v2(self.live), methods=["GET"]),
            Route("/v2/health/ready", v2(self.ready), methods=["GET"]),
            Route("/v2/models/stats", v2(self.model_stats), methods=["GET"]),
            Route("/v2/repository/index", v2(self.repository_index), methods=["POST"]),
            Route("/v2/repository/models/{model}/load", v2(self.load), methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", v2(self.unload), methods=["POST"]),
            Route("/v2/systemsharedmemory/status", v2(self.shm_status), methods=["GET"]),
            Route("/v2/systemsharedmemory/region/{region}/status", v2(self.shm_status), methods=["GET"]),
            Route("/v2/systemsharedmemory/region/{region}/register", v2(self.shm_register), methods=["POST"]),
            Route("/v2/systemsharedmemory/unregister", v2(self.shm_unregister), methods=["POST"]),
            Route("/v2/systemsharedmemory/region/{region}/unregister", v2(self.shm_unregister), methods=["POST"]),
        ]
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            routes += [
                Route(prefix, v2(self.model_metadata), methods=["GET"]),
                Route(prefix + "/ready", v2(self.model_ready), methods=["GET"]),
                Route(prefix + "/config", v2(self.model_config), methods=["GET"]),
                Route(prefix + "/stats", v2(self.model_stats), methods=["GET"]),
                Route(prefix + "/infer", v2(self.infer), methods=["POST"]),
            ]
        return (routes + generate_routes(self.service, self.max_input_bytes, v2_error)
                + extension_routes(self.service, self.max_input_bytes, v2))

    async def live(self, _: Request) -> Response:
        """``GET /v2/health/live`` (and ``/``)."""
        return _health({"live": self.service.server_live(pb.ServerLiveRequest()).live}, "live")

    async def ready(self, _: Request) -> Response:
        """``GET /v2/health/ready``."""
        return _health({"ready": self.service.server_ready(pb.ServerReadyRequest()).ready}, "ready")

    async def server_metadata(self, _: Request) -> Response:
        """``GET /v2``."""
        return JSONResponse(message_to_json(self.service.server_metadata(pb.ServerMetadataRequest())))

    async def model_ready(self, request: Request) -> Response:
        """``GET /v2/models/{model}[/versions/{version}]/ready``."""
        name, version = _path(request)
        is_ready = self.service.model_ready(pb.ModelReadyRequest(name=name, version=version)).ready
        return _health({"name": name, "ready": is_ready}, "ready")

    async def model_metadata(self, request: Request) -> Response:
        """``GET /v2/models/{model}[/versions/{version}]``."""
        name, version = _path(request)
        metadata = self.service.model_metadata(pb.ModelMetadataRequest(name=name, version=version))
        return JSONResponse(message_to_json(metadata))

    async def model_config(self, request: Request) -> Response:
        """``GET /v2/models/{model}[/versions/{version}]/config``."""
        name, version = _path(request)
        config = self.service.model_config(pb.ModelConfigRequest(name=name, version=version)).config
        return JSONResponse(message_to_json(config))

    async def model_stats(self, request: Request) -> Response:
        """``GET /v2/models[/{model}[/versions/{version}]]/stats``."""
        name, version = request.path_params.get("model", ""), request.path_params.get("version", "")
        stats = await self.service.model_statistics(pb.ModelStatisticsRequest(name=name, version=version))
        return JSONResponse(message_to_json(stats))

    async def infer(self, request: Request) -> Response:
        """``POST /v2/models/{model}[/versions/{version}]/infer``: JSON, or JSON with binary tensors."""
        received = time.perf_counter_ns()
        name, version = _path(request)
        header_length, accept = header_values(request.scope, _HEADER_LENGTH, b"accept-encoding")
        parsed = await self.parse_infer(request, name, version, header_length)
        service = self.service
        carrier = dict(request.headers) if service.traces else None  # a W3C traceparent, read only when tracing
        # the response's raw contents are the buffers gRPC would send (views of the output arrays)
        if self.header_forward is not None:
            parsed = replace(parsed, request=forwarded(parsed.request, request.headers.items(), self.header_forward))
        response, report = await service.model_infer_reported(parsed.request, carrier)
        content: Sequence[Buffer]  # the JSON, then the binary outputs
        json_length: int | None
        elements, texts = _json_elements(response, parsed)
        offload = service.offload
        if is_heavy(elements * 4):  # the JSON writer holds the GIL throughout: a worker process
            content, json_length = await offload.in_process(render_detached, detached(response),
                                                            replace(parsed, request=InferRequest(RequestHeader())))
        elif is_heavy(0, texts):  # BYTES decoded element by element
            content, json_length = await offload.in_thread(render_infer_response, response, parsed)
        else:
            content, json_length = render_infer_response(response, parsed)
        headers = timing_pairs(report, time.perf_counter_ns() - received)
        if report.trace_id:
            headers.append((b"x-trace-id", report.trace_id.encode()))
        if json_length is not None:
            headers.append((_HEADER_LENGTH, b"%d" % json_length))
        media = _JSON if json_length is None else _OCTETS
        if accept and is_heavy(sum(map(len, content))):
            return await self.service.offload.in_thread(compressed, content, accept, headers, media)
        return compressed(content, accept, headers, media)

    async def parse_infer(self, request: Request, name: str, version: str, header: bytes | None) -> HttpInfer:
        """The infer body as a ``ModelInferRequest`` (binary inputs beside it as views of the body);
        ``header``: the request's Inference-Header-Content-Length, if any."""
        body = await read_body(request, self.max_input_bytes)
        header_length = _header_length(header.decode("latin-1") if header is not None else None)
        if header_length == 0:
            config = self.service.model_config(pb.ModelConfigRequest(name=name, version=version)).config
            return raw_binary_request(body, name, version, config)
        json_bytes = len(body) if header_length is None else header_length
        if is_heavy(json_bytes):  # the JSON parser holds the GIL throughout: a worker process
            return await self.service.offload.in_process(parse_detached, body, header_length, name, version,
                                                         self.max_input_bytes)
        # binary inputs stay views of the body: nothing heavy; the JSON text is freed once parsed
        return parse_infer_request(body, header_length, name, version, self.max_input_bytes)

    async def repository_index(self, request: Request) -> Response:
        """``POST /v2/repository/index``."""
        body = load_json(await read_body(request, self.max_input_bytes))
        ready = bool(body.get("ready", False)) if isinstance(body, dict) else False
        index = await self.service.extensions.repository_index(pb.RepositoryIndexRequest(ready=ready))
        rows = [{k: v for k, v in message_to_json(m).items() if v != "" or k == "name"} for m in index.models]
        return JSONResponse(rows)

    async def repository_request(self, request: Request, message: Any) -> Any:
        """The load or unload message for the path's model, with the body's parameters."""
        message.model_name = request.path_params["model"]
        body = load_json(await read_body(request, self.max_input_bytes))
        for key, value in _repository_parameters(body).items():
            _repository_parameter(message.parameters[key], key, value)
        return message

    async def load(self, request: Request) -> Response:
        """``POST /v2/repository/models/{model}/load``."""
        await self.service.extensions.repository_model_load(await self.repository_request(request, pb.RepositoryModelLoadRequest()))
        return JSONResponse({})

    async def unload(self, request: Request) -> Response:
        """``POST /v2/repository/models/{model}/unload``."""
        message = await self.repository_request(request, pb.RepositoryModelUnloadRequest())
        await self.service.extensions.repository_model_unload(message)
        return JSONResponse({})

    async def shm_status(self, request: Request) -> Response:
        """``GET /v2/systemsharedmemory[/region/{region}]/status``."""
        name = request.path_params.get("region", "")
        status = self.service.extensions.system_shared_memory_status(pb.SystemSharedMemoryStatusRequest(name=name))
        return JSONResponse([message_to_json(region) for region in status.regions.values()])

    async def shm_register(self, request: Request) -> Response:
        """``POST /v2/systemsharedmemory/region/{region}/register``."""
        body = load_json(await read_body(request, self.max_input_bytes))
        if not isinstance(body, dict) or not isinstance(body.get("key"), str) or not all(
                isinstance(body.get(k, 0), int) and not isinstance(body.get(k, 0), bool) and 0 <= body.get(k, 0) < 2**64
                for k in ("offset", "byte_size")):
            raise InvalidInput("the register body must be {\"key\": string, \"offset\": uint64, \"byte_size\": uint64}")
        await self.service.extensions.system_shared_memory_register(pb.SystemSharedMemoryRegisterRequest(
            name=request.path_params["region"], key=body["key"], offset=body.get("offset", 0),
            byte_size=body.get("byte_size", 0)))
        return JSONResponse({})

    async def shm_unregister(self, request: Request) -> Response:
        """``POST /v2/systemsharedmemory[/region/{region}]/unregister``."""
        name = request.path_params.get("region", "")
        await self.service.extensions.system_shared_memory_unregister(pb.SystemSharedMemoryUnregisterRequest(name=name))
        return JSONResponse({})


def v2_error(_: Request, err: Exception) -> Response:
    """V2's error envelope ``{"error": ...}``: the status of the one table in ``http.status``, or
    of Starlette's own ``HTTPException`` (404 for no route, 405 for a method a route lacks)."""
    if isinstance(err, HTTPException):
        return JSONResponse({"error": err.detail}, status_code=err.status_code, headers=err.headers)
    return error_response(err)


def _path(request: Request) -> tuple[str, str]:
    return request.path_params["model"], request.path_params.get("version", "")


def _health(body: dict[str, Any], key: str) -> Response:
    """200 with the JSON body when true, 400 when false (V2: 4xx means false; KServe clients read the body)."""
    return JSONResponse(body, status_code=200 if body[key] else 400)


def _json_elements(response: InferResponse, parsed: HttpInfer) -> tuple[int, int]:
    """(elements of the outputs going back as JSON, BYTES elements among them): what rendering them costs."""
    elements = texts = 0
    if parsed.all_binary:
        return 0, 0
    for tensor in response.outputs:
        if tensor.name not in parsed.binary_outputs and "shared_memory_region" not in tensor.parameters:
            count = math.prod(tensor.shape)
            elements += count
            if tensor.datatype == "BYTES":
                texts += count
    return elements, texts


def _header_length(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or len(value) > 18:
        raise InvalidInput(f"Inference-Header-Content-Length '{value[:40]}' is not a valid length")
    return int(value)


def _repository_parameters(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    return parameters


def _repository_parameter(target: pb.ModelRepositoryParameter, key: str, value: Any) -> None:
    """A JSON parameter as the protobuf one; ``file:`` contents are base64 over HTTP (Triton).

    Which keys and types a load or unload accepts is the service's to check, as over gRPC.
    """
    if key.startswith("file:") and isinstance(value, str):
        try:
            target.bytes_param = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput(f"load parameter '{key}' is not valid base64") from None
    elif isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int) and -(2**63) <= value < 2**63:
        target.int64_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        raise InvalidInput(f"Unrecognized repository parameter '{key}'")
