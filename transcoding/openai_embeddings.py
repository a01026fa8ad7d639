"""OpenAI's ``POST /v1/embeddings`` and ``GET /v1/models[/{id}]`` on the text models.

Two specifications meet here: OpenAI's API reference ("Embeddings", "Models") and SIE's
(HTTP API reference), which lists models as ``{"models": [ModelInfo]}``. ``/v1/models`` answers
both in one document - OpenAI's ``object: "list"`` and ``data`` (``id``, ``object: "model"``,
``created``, ``owned_by``) beside SIE's ``models`` - and ``/v1/models/{id}`` one model's OpenAI
fields beside its ModelInfo. Where they collide, OpenAI wins: these routes answer JSON unless
``Accept`` asks for msgpack, and errors come in OpenAI's envelope (``openai_codec``).

``/v1/embeddings``: ``input`` in every OpenAI form (``token_ids`` says how ids are read);
``encoding_format`` ``float`` (lists) or ``base64`` (little-endian float32 bytes, as the OpenAI
SDK decodes them); ``dimensions`` keeps the first N components and re-normalises them (rejected
above the model's width); ``user`` is accepted; ``usage`` counts the model tokenizer's tokens;
an input over the model's ``max_sequence_length`` is refused with OpenAI's
``context_length_exceeded`` (400). Each request is one V2 request through ``TextModels.infer``.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.errors import NotFound
from kserve_v2.service import InferenceService
from kserve_v2.settings import TOKEN_ID_MODES
from transcoding import sie_schema
from transcoding.openai_codec import InvalidField, error_response, render
from transcoding.sie import TextModels
from transcoding.sie_codec import read_request
from transcoding.timing import response_headers, timing_body, trace_id
from transcoding.token_ids import decode_cl100k, input_items


def openai_routes(service: InferenceService, max_bytes: int, token_ids: str = "tiktoken") -> list[Route]:
    """The ``/v1/embeddings``, ``/v1/models`` and ``/v1/models/{id}`` routes.

    Args:
        token_ids: how token-id ``input`` is read: ``tiktoken`` (cl100k_base ids) or ``model``
            (the model tokenizer's ids); see ``transcoding.token_ids``.
    """
    if token_ids not in TOKEN_ID_MODES:
        raise ValueError(f"token_ids must be one of {TOKEN_ID_MODES}, got '{token_ids}'")
    models = TextModels(service)
    started = int(time.time())

    def card(info: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's Model object: ``created`` is when the server started, ``owned_by`` its name."""
        owner = service.server_metadata(pb.ServerMetadataRequest()).name
        return {"id": info["name"], "object": "model", "created": started, "owned_by": owner}

    async def embeddings(request: Request) -> Response:
        received = time.perf_counter_ns()
        try:
            body = await read_request(request, sie_schema.EMBEDDINGS, max_bytes)
            name = request.state.model = models.resolve(body["model"])
            metadata = models.require(name, "dense")
            width = next(int(o.shape[-1]) for o in metadata.outputs if o.name == "dense")
            dimensions = body.get("dimensions", width)
            if dimensions > width:
                raise InvalidField(f"model '{name}' gives {width}-dimensional embeddings; it cannot give "
                                   f"dimensions={dimensions}", "dimensions")
            items, are_ids = input_items(body["input"])
            parameters = {"overflow_policy": "error"}
            if are_ids and token_ids == "tiktoken":
                items = decode_cl100k(items)
            elif are_ids:
                parameters["token_ids"] = "model"
            arrays, report = await models.infer(request, "embeddings", name, {"text": items}, ["dense"], parameters)
            vectors = arrays["dense"].astype("<f4", copy=False)
            if dimensions < width:
                vectors = vectors[:, :dimensions]
                vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            as_base64 = body.get("encoding_format", "float") == "base64"
            data = [{"object": "embedding", "index": i,
                     "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist()}
                    for i, v in enumerate(vectors)]
            total = time.perf_counter_ns() - received
            content = {"object": "list", "model": body["model"], "data": data,
                       "usage": {"prompt_tokens": report.tokens, "total_tokens": report.tokens},
                       "timing": timing_body(report, total)}
            return render(request, content, headers=response_headers(request.headers, report, total))
        except Exception as err:  # noqa: BLE001 - every failure becomes OpenAI's envelope
            return error_response(request, err, {"X-Trace-ID": trace_id(request.headers)})

    async def list_models(request: Request) -> Response:
        try:
            infos = [info for info in (models.info(name) for name in models.names()) if info is not None]
            content = {"object": "list", "data": [card(info) for info in infos], "models": infos}
            return render(request, content, headers={"X-Trace-ID": trace_id(request.headers)})
        except Exception as err:  # noqa: BLE001
            return error_response(request, err, {"X-Trace-ID": trace_id(request.headers)})

    async def one_model(request: Request) -> Response:
        try:
            name = request.state.model = models.resolve(request.path_params["model"])
            info = models.info(name)
            if info is None:
                raise NotFound(f"Model '{name}' is not a text model (it has no BYTES 'text' input)")
            return render(request, {**card(info), **info}, headers={"X-Trace-ID": trace_id(request.headers)})
        except Exception as err:  # noqa: BLE001
            return error_response(request, err, {"X-Trace-ID": trace_id(request.headers)})

    return [Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", one_model, methods=["GET"])]
