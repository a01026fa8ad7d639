"""Triton's generate extension on REST (its "Generate Extension" page, provisional there):
``POST /v2/models/{m}[/versions/{v}]/generate`` and ``/generate_stream``.

Both transcode a flat JSON object into a ``ModelInferRequest`` (the wire codec's ``InferRequest``,
as every transport builds) and run it through the service's one
stream call (``InferenceService.model_stream``, as ModelStreamInfer does); no second inference path.
Each key is an input tensor when the model has an input of that name, else a request parameter
(string, number or boolean); the keys of a ``parameters`` object are mapped the same way, and
``id`` is the request id. An input's value is a JSON scalar or a flat array; its shape is the
model's, whose one variable dim (the innermost) takes the elements given, the other variable dims
(a batch dim) 1. A response is a flat object: ``id`` (when the request has one), ``model_name``,
``model_version``, the response's parameters, and each output by name, a scalar when it has one
element, else a flat array.

``/generate`` answers with exactly one response; a model that gives none or several gets Triton's
error. ``/generate_stream`` answers ``text/event-stream; charset=utf-8`` with one Server-Sent Event
per response, written as Triton writes them: ``data: <JSON>`` and a blank line, an error as
``data: {"error": "<message>"}``; the status is the first event's (200, or its error's). A request
that fails before any response answers a JSON error, as every V2 route does. A client that goes
away cancels its request (``kserve_v2.service.streaming``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.codec.messages import InferRequest, InferResponse, InputTensor, RequestHeader, parameter
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import BF16, BYTES, DType
from kserve_v2.protocol.errors import InternalError, InvalidInput, ServerError
from kserve_v2.protocol.tensors import from_raw, pack_bytes
from kserve_v2.service.inference_service import InferenceService
from transcoding.http.body import read_body
from transcoding.http.routes import ErrorEnvelope, Handler, guarded
from transcoding.http.status import TO_HTTP

EVENT_STREAM = "text/event-stream"  # Starlette adds "; charset=utf-8", as Triton's header reads
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that generates "
                "various number of responses")
# JSON type checks with TritonJson's texts (what Triton's generate endpoint answers)
_TEXTS = {"BOOL": ("non-boolean as boolean", (bool,)), "BYTES": ("non-string as string", (str,)),
          "i": ("non-signed-integer as signed-integer", (int,)), "u": ("non-unsigned-integer as unsigned-integer", (int,)),
          "f": ("non-double as double", (int, float))}


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in order, duplicates kept (``json.loads``'s pairs hook)."""


def generate_routes(service: InferenceService, max_input_bytes: int, envelope: ErrorEnvelope) -> list[BaseRoute]:
    """The four generate routes, each answering errors with ``envelope`` (the V2 ``{"error"}``)."""
    routes = GenerateRoutes(service, max_input_bytes)

    def wrapped(handler: Handler) -> Handler:
        return guarded(handler, envelope)

    return [Route(prefix + suffix, wrapped(handler), methods=["POST"])
            for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
            for suffix, handler in (("/generate", routes.generate), ("/generate_stream", routes.generate_stream))]


class GenerateRoutes:
    """The handlers of the generate routes (see the module docstring).

    Args:
        service: the one request path.
        max_input_bytes: largest request body (413 above it).
    """

    def __init__(self, service: InferenceService, max_input_bytes: int) -> None:
        self._service = service
        self._max_input_bytes = max_input_bytes

    async def generate(self, request: Request) -> Response:
        """``POST .../generate``: the model's one response as JSON.

        Raises:
            ServerError: the request's failure, the response's error, or none or several responses
                (Triton's text, INTERNAL / 500).
        """
        message = await self._message(request)
        answers = [item async for item in self._service.model_stream(message)
                   if item.response is not None or item.error is not None]
        if len(answers) != 1:
            raise InternalError(ONE_RESPONSE)
        if answers[0].error is not None:
            raise answers[0].error
        assert answers[0].response is not None
        return JSONResponse(response_json(answers[0].response))

    async def generate_stream(self, request: Request) -> Response:
        """``POST .../generate_stream``: every response as a Server-Sent Event, as it comes.

        Raises:
            ServerError: a request that fails before its first response (answered as JSON).
        """
        message = await self._message(request)
        items = self._service.model_stream(message)
        first: Streamed | None = None
        async for item in items:  # up to the first event: a failure before it is a JSON error
            if item.response is not None or item.error is not None:
                first = item
                break
        status = 200
        if first is not None and first.error is not None:
            code = first.error.code if isinstance(first.error, ServerError) else None
            status = TO_HTTP[code] if code is not None else 500
        return StreamingResponse(_events(first, items), status_code=status, media_type=EVENT_STREAM)

    async def _message(self, request: Request) -> InferRequest:
        """The body as a ``ModelInferRequest`` for the path's model (see the module docstring).

        Raises:
            InvalidInput: a body that is not a JSON object, and the mapping's errors (Triton's texts).
            NotFound / Unavailable: the model's metadata cannot be read.
        """
        name, version = request.path_params["model"], request.path_params.get("version", "")
        request.state.model = name
        body = await read_body(request, self._max_input_bytes)
        try:
            pairs = json.loads(body or b"{}", object_pairs_hook=_Object)
        except (ValueError, RecursionError) as err:
            raise InvalidInput(f"malformed JSON: {err}") from None
        if not isinstance(pairs, _Object):
            raise InvalidInput("the generate request must be a JSON object")
        metadata = self._service.model_metadata(pb.ModelMetadataRequest(name=name, version=version))
        inputs = {tensor.name: tensor for tensor in metadata.inputs}
        message = InferRequest(RequestHeader(name, version))
        for key, value in pairs:
            if key == "id":
                if not isinstance(value, str):
                    raise InvalidInput("Unable to parse 'id': attempt to access JSON non-string as string")
                message.id = value
            elif key == "parameters" and key not in inputs:
                if not isinstance(value, _Object):
                    raise InvalidInput("Expected JSON object for keyword: 'parameters'")
                for nested, nested_value in value:
                    try:
                        _map(message, inputs, nested, nested_value)
                    except InvalidInput as err:
                        raise InvalidInput(f"Converting keyword: 'parameters': {err}") from None
            else:
                _map(message, inputs, key, value)
        return message


def _map(message: InferRequest, inputs: dict[str, pb.ModelMetadataResponse.TensorMetadata], key: str,
         value: Any) -> None:
    """One key of the body: an input when the model has it, else a parameter."""
    tensor = inputs.get(key)
    if tensor is None:
        if isinstance(value, list) or value is None:
            raise InvalidInput(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        if key in message.parameters:
            raise InvalidInput(f"parameter '{key}' already exists in request")
        message.parameters[key] = parameter(value)
        return
    if any(sent.name == key for sent in message.inputs):
        raise InvalidInput(f"input '{key}' already exists in request")
    dtype = datatypes.BY_V2[tensor.datatype]
    values = value if isinstance(value, list) and not isinstance(value, _Object) else [value]
    _check(values, dtype)
    message.inputs.append(InputTensor(key, tensor.datatype, _shape(key, list(tensor.shape), len(values))))
    if dtype is BYTES:
        message.raw_input_contents.append(pack_bytes(np.array(values, dtype=object)))
    else:
        try:
            message.raw_input_contents.append(np.array(values, dtype=dtype.numpy).tobytes())
        except (OverflowError, ValueError, TypeError) as err:
            raise InvalidInput(f"the values of input '{key}' do not fit {tensor.datatype}: {err}") from None


def _check(values: list[Any], dtype: DType) -> None:
    """Each value has the JSON type the datatype reads (TritonJson's texts; a bool is no number).

    Raises:
        InvalidInput: "attempt to access JSON non-<type> as <type>", or FP16/BF16, which JSON cannot carry.
    """
    if dtype.contents_field is None and dtype is not BYTES:
        raise InvalidInput(f"receiving {dtype.v2} data via JSON is not supported")
    text, kinds = _TEXTS.get(dtype.v2) or _TEXTS[dtype.numpy.kind]
    for value in values:
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise InvalidInput(f"attempt to access JSON {text}")


def _shape(name: str, shape: list[int], count: int) -> list[int]:
    """The input's shape for ``count`` elements (Triton's two passes: fixed dims divide the count, the
    innermost variable dim takes what is left, the other variable dims 1).

    Raises:
        InvalidInput: "The schema can not convert input '<name>' to tensor with proper shape".
    """
    refused = InvalidInput(f"The schema can not convert input '{name}' to tensor with proper shape")
    left = count
    for dim in reversed(shape):
        if dim != -1:
            if dim == 0 or left % dim:
                raise refused
            left //= dim
    filled = []
    for dim in reversed(shape):
        if dim == -1:
            dim, left = left, 1
        filled.append(dim)
    if left != 1:
        raise refused
    return filled[::-1]


def response_json(response: InferResponse) -> dict[str, Any]:
    """A response as the generate extension writes it (see the module docstring)."""
    answer: dict[str, Any] = {}
    if response.id:
        answer["id"] = response.id
    answer["model_name"], answer["model_version"] = response.model_name, response.model_version
    for key, given in response.parameters.items():
        if given.choice is not None:
            answer[key] = given.value
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        dtype = datatypes.BY_V2[tensor.datatype]
        array = from_raw(raw, dtype, list(tensor.shape), f"output '{tensor.name}'").reshape(-1)
        values: list[Any]
        if dtype is BYTES:
            values = [item.decode("utf-8", errors="replace") for item in array]
        else:
            values = (array.astype(np.float32) if dtype is BF16 else array).tolist()
        answer[tensor.name] = values[0] if len(values) == 1 else values
    return answer


async def _events(first: Streamed | None, rest: AsyncGenerator[Streamed, None]) -> AsyncIterator[bytes]:
    """The Server-Sent Events of a stream whose first event is ``first`` (None: no event at all)."""
    try:
        if first is not None:
            yield _event(first)
        async for item in rest:
            if item.response is not None or item.error is not None:
                yield _event(item)
    finally:
        await rest.aclose()


def _event(item: Streamed) -> bytes:
    """One response as a Server-Sent Event: ``data: <JSON>`` and a blank line."""
    if item.error is not None:
        message = str(item.error) if isinstance(item.error, ServerError) else "Internal server error"
        body: dict[str, Any] = {"error": message}
    else:
        assert item.response is not None
        body = response_json(item.response)
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
