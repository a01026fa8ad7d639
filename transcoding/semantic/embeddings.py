"""OpenAI's ``POST /v1/embeddings`` and ``GET /v1/models[/{id}]`` on the text models, and ``POST /v1/tokenize``.

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
``context_length_exceeded`` (400), naming its token count and the limit, unless ``truncate``
(text-embeddings-inference's boolean, with ``truncation_direction``, or Cohere's
``NONE``/``START``/``END``) asks to cut it; ``prompt_name`` (``query`` or ``document``, the
default) chooses the model's configured prefix, and ``instruction`` (SIE's, as ``/v1/encode`` takes
it) goes ahead of that prefix.

``/v1/tokenize`` (after vLLM's and text-embeddings-inference's ``/tokenize``): ``input`` (a string or
a list; vLLM's ``prompt`` for one string), ``add_special_tokens`` (default true) and
``prompt_name``; per input its ``ids``, ``count``, character ``offsets`` and ``special`` flags, as
the model's tokenizer gives them without truncation, with the model's ``max_model_len`` (its
``max_sequence_length``) and the total ``count``; for one string also vLLM's ``tokens`` (its ids).

Each request is one service call, ``TextModels.infer``, planned from the model's
contract (``kserve_v2.backend.text``): tokenize asks only for the model's ``tokens`` output, which runs
its tokenizer and not the model.
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
from kserve_v2.backend.text import InputKind, OutputKind, TextContract
from kserve_v2.protocol.errors import NotFound
from kserve_v2.service.inference_service import InferenceService
from kserve_v2.settings.server import TOKEN_ID_MODES
from transcoding.http.routes import guarded
from transcoding.http.timing import semantic_timing, trace_id
from transcoding.semantic import body_schemas
from transcoding.semantic.openai_codec import InvalidField, error_response, render, wants_msgpack
from transcoding.semantic.sie_codec import read_request
from transcoding.semantic.text_calls import Call, model_info, prompt_parameters, truncation
from transcoding.semantic.token_ids import decode_cl100k, input_items


def openai_error(request: Request, err: Exception, detail: bool = False) -> Response:
    """OpenAI's error envelope, with ``X-Trace-ID`` (``detail``: see ``openai_codec.error_response``)."""
    return error_response(request, err, {"X-Trace-ID": trace_id(request.headers)}, detail)


class OpenAiRoutes:
    """The handlers of OpenAI's routes on one service.

    Args:
        service: the one request path.
        max_bytes: the largest request body (413 above it).
        token_ids: how token-id ``input`` is read: ``tiktoken`` (cl100k_base ids) or ``model``
            (the model tokenizer's ids); see ``transcoding.semantic.token_ids``.
    """

    def __init__(self, service: InferenceService, max_bytes: int, token_ids: str) -> None:
        if token_ids not in TOKEN_ID_MODES:
            raise ValueError(f"token_ids must be one of {TOKEN_ID_MODES}, got '{token_ids}'")
        self.service = service
        self.max_bytes = max_bytes
        self.token_ids = token_ids
        self.started = int(time.time())

    def routes(self) -> list[Route]:
        """``/v1/embeddings``, ``/v1/tokenize``, ``/v1/models`` and ``/v1/models/{id}``."""
        return [Route("/v1/embeddings", guarded(self.embeddings, openai_error), methods=["POST"]),
                Route("/v1/tokenize", guarded(self.tokenize, openai_error), methods=["POST"]),
                Route("/v1/models", guarded(self.list_models, openai_error), methods=["GET"]),
                Route("/v1/models/{model:path}", guarded(self.one_model, openai_error), methods=["GET"])]

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``: one dense vector per input (see the module docstring)."""
        received = time.perf_counter_ns()
        body = await read_request(request, body_schemas.EMBEDDINGS, self.max_bytes)
        parameters = {"overflow_policy": "error", **truncation(body.get("truncate"), body.get("truncation_direction")),
                      **prompt_parameters(body.get("instruction"), body.get("prompt_name"))}
        call = Call(request, {}, [(OutputKind.DENSE, "float32")], parameters)

        def dimensions_and_input(name: str, contract: TextContract) -> None:
            width = contract.width(OutputKind.DENSE)
            if body.get("dimensions", width) > width:
                raise InvalidField(f"model '{name}' gives {width}-dimensional embeddings; it cannot give "
                                   f"dimensions={body['dimensions']}", "dimensions")
            items, are_ids = input_items(body["input"])
            if are_ids and self.token_ids == "tiktoken":
                items = decode_cl100k(items)
            elif are_ids:
                call.parameters["token_ids"] = "model"
            call.texts[InputKind.TEXT] = items

        call.check = dimensions_and_input
        arrays, report = await self.service.text.infer(body["model"], call, dict(request.headers), "embeddings")
        dense = call.outputs[OutputKind.DENSE]
        vectors = arrays[dense.values].astype("<f4", copy=False)
        dimensions = body.get("dimensions", dense.width)
        if dimensions < dense.width:
            vectors = vectors[:, :dimensions]
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        as_base64 = body.get("encoding_format", "float") == "base64"
        as_lists = wants_msgpack(request)  # msgpack: plain lists; JSON: the arrays (json_text writes float32)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64
                 else v.tolist() if as_lists else v}
                for i, v in enumerate(vectors)]
        content: dict[str, Any] = {"object": "list", "model": body["model"], "data": data,
                                   "usage": {"prompt_tokens": report.tokens, "total_tokens": report.tokens}}
        content["timing"], headers = semantic_timing(request.headers, report, received)
        return render(request, content, headers=headers)

    async def tokenize(self, request: Request) -> Response:
        """``POST /v1/tokenize``: each input's tokens (see the module docstring)."""
        received = time.perf_counter_ns()
        body = await read_request(request, body_schemas.TOKENIZE, self.max_bytes)
        given = body["prompt"] if "prompt" in body else body["input"]
        items = [given] if isinstance(given, str) else given
        parameters = {"add_special_tokens": str(body.get("add_special_tokens", True)).lower()}
        if "prompt_name" in body:
            parameters["prompt_name"] = body["prompt_name"]
        call = Call(request, {InputKind.TEXT: items}, [(OutputKind.TOKENS, None)], parameters)
        arrays, report = await self.service.text.infer(body["model"], call, dict(request.headers), "tokenize")
        tokens = call.outputs[OutputKind.TOKENS]
        rows, lengths = arrays[tokens.values], arrays[tokens.lengths or ""]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        data = [{"index": i, "count": int(lengths[i]), "ids": rows[bounds[i]:bounds[i + 1], 0],
                 "offsets": rows[bounds[i]:bounds[i + 1], 1:3], "special": rows[bounds[i]:bounds[i + 1], 3].astype(bool)}
                for i in range(len(items))]
        content: dict[str, Any] = {"model": body["model"], "max_model_len": call.contract.max_sequence_length,
                                   "count": int(lengths.sum()), "data": data}
        if isinstance(given, str):
            content["tokens"] = data[0]["ids"]
        content["timing"], headers = semantic_timing(request.headers, report, received)
        return render(request, content, headers=headers)

    async def list_models(self, request: Request) -> Response:
        """``GET /v1/models``: every text model, loaded or not, in both OpenAI's and SIE's shapes."""
        infos = [model_info(info) for info in self.service.text.models()]
        owner = self._owner()
        content = {"object": "list", "data": [self._card(info, owner) for info in infos], "models": infos}
        return render(request, content, headers={"X-Trace-ID": trace_id(request.headers)})

    async def one_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``: one text model's OpenAI fields beside its ModelInfo."""
        found = self.service.text.model(request.path_params["model"])
        request.state.model = found.name
        if not found.kinds:
            raise NotFound(f"Model '{found.name}' is not a text model (it has no BYTES 'text' input)")
        info = model_info(found)
        return render(request, {**self._card(info, self._owner()), **info}, headers={"X-Trace-ID": trace_id(request.headers)})

    def _owner(self) -> str:
        return self.service.server_metadata(pb.ServerMetadataRequest()).name

    def _card(self, info: dict[str, Any], owner: str) -> dict[str, Any]:
        """OpenAI's Model object: ``created`` is when the server started, ``owned_by`` its name."""
        return {"id": info["name"], "object": "model", "created": self.started, "owned_by": owner}


def openai_routes(service: InferenceService, max_bytes: int, token_ids: str = "tiktoken") -> list[Route]:
    """The ``/v1/embeddings``, ``/v1/tokenize``, ``/v1/models`` and ``/v1/models/{id}`` routes (see ``OpenAiRoutes``)."""
    return OpenAiRoutes(service, max_bytes, token_ids).routes()
