"""The semantic endpoints of SIE's HTTP API reference: encode, score, extract, health.

Each route checks its body (``body_schemas``), states the texts and output kinds it wants as a
``text_calls.Call``, and makes one service call, ``TextModels.infer``, which runs it as
a V2 request through the same path as gRPC. The model's typed contract (``kserve_v2.backend.text``) says
which outputs it gives, in which V2 tensors, with which widths; no inference happens here. A model
is addressed by its repository name, or by the ``alias`` parameter of its config
(``sentence-transformers/all-MiniLM-L6-v2``; a slash is fine). Every body carries SIE's ``timing``
and every answer ``X-Trace-ID`` (``transcoding.http.timing``); every error is SIE's envelope
(``sie_error``). ``/v1/models`` lives with the OpenAI routes (``embeddings``), which answer both shapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kserve_v2.backend.text import InputKind, OutputKind, TextContract
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.service.inference_service import InferenceService
from transcoding.http.routes import guarded, resolved_model
from transcoding.http.timing import semantic_timing, trace_id
from transcoding.semantic import body_schemas
from transcoding.semantic.sie_codec import error_response, read_request, render
from transcoding.semantic.text_calls import PRODUCE, Call, prompt_parameters, truncation


def sie_error(request: Request, err: Exception) -> Response:
    """SIE's error envelope, naming the model when the route resolved it, with ``X-Trace-ID``."""
    response = error_response(request, err, resolved_model(request))
    response.headers["X-Trace-ID"] = trace_id(request.headers)
    return response


class SieRoutes:
    """The handlers of SIE's semantic routes on one service.

    Args:
        service: the one request path.
        max_bytes: the largest request body (413 above it).
    """

    def __init__(self, service: InferenceService, max_bytes: int) -> None:
        self.service = service
        self.max_bytes = max_bytes

    def routes(self) -> list[Route]:
        """``/v1/encode|score|extract/{model}``, ``/healthz``, ``/readyz``."""
        return [Route("/v1/encode/{model:path}", guarded(self.encode, sie_error), methods=["POST"]),
                Route("/v1/score/{model:path}", guarded(self.score, sie_error), methods=["POST"]),
                Route("/v1/extract/{model:path}", guarded(self.extract, sie_error), methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"])]

    async def run(self, call: Call, endpoint: str) -> tuple[dict[str, np.ndarray], RequestReport]:
        """The call's one execution through the service."""
        return await self.service.text.infer(call.http.path_params["model"], call, dict(call.http.headers), endpoint)

    async def encode(self, request: Request) -> Response:
        """``POST /v1/encode/{model}``: dense, sparse and multivector embeddings of each item."""
        received = time.perf_counter_ns()
        body = await read_request(request, body_schemas.ENCODE, self.max_bytes)
        params = body.get("params") or {}
        kinds = [OutputKind(kind) for kind in dict.fromkeys(params.get("output_types") or ["dense"])]
        dtype = params.get("output_dtype", "float32")
        items = body["items"]

        def dense_only(name: str, contract: TextContract) -> None:
            if dtype != "float32" and kinds != [OutputKind.DENSE]:
                raise InvalidInput(f"output_dtype '{dtype}' applies to dense outputs only; "
                                   f"ask for float32 with {[kind.value for kind in kinds]}")
            _check(name, items, params.get("options"))

        call = Call(request, {InputKind.TEXT: _texts(items)},
                    [(kind, dtype if kind is OutputKind.DENSE else None) for kind in kinds],
                    _parameters(params.get("instruction"), params.get("options"), params), PRODUCE, dense_only)
        arrays, report = await self.run(call, "encode")
        results = [_echo_id(item, i, default=False) for i, item in enumerate(items)]
        for kind, output in sorted(call.outputs.items(), key=lambda pair: list(OutputKind).index(pair[0])):
            values = arrays[output.values]
            bounds = np.concatenate([[0], np.cumsum(arrays[output.lengths])]) if output.lengths else None
            for i, result in enumerate(results):
                if kind is OutputKind.DENSE:
                    result["dense"] = {"dims": output.width, "dtype": dtype, "values": values[i]}
                elif bounds is not None and output.indices is not None:
                    part = slice(bounds[i], bounds[i + 1])
                    result[kind.value] = {"dims": output.width, "dtype": output.dtype,
                                          "indices": arrays[output.indices][part], "values": values[part]}
                elif bounds is not None:
                    vectors = values[bounds[i]:bounds[i + 1]]
                    result[kind.value] = {"token_dims": output.width, "num_tokens": len(vectors),
                                          "dtype": output.dtype, "values": vectors}
        return _answer(request, {"model": call.name, "items": results}, report, received)

    async def score(self, request: Request) -> Response:
        """``POST /v1/score/{model}``: each item's relevance to the query, ranked."""
        received = time.perf_counter_ns()
        body = await read_request(request, body_schemas.SCORE, self.max_bytes)
        items = body["items"]
        call = Call.score(request, body["query"]["text"], _texts(items), _parameters(body.get("instruction"), body.get("options")),
                          check=lambda name, _: _check(name, items, body.get("options")))
        arrays, report = await self.run(call, "score")
        values = arrays[call.outputs[OutputKind.SCORE].values]
        order = sorted(range(len(items)), key=lambda i: -float(values[i]))
        scores = [{"item_id": items[i].get("id"), "score": float(values[i]), "rank": rank} for rank, i in enumerate(order)]
        return _answer(request, {"model": call.name, "query_id": body["query"].get("id"), "scores": scores}, report,
                       received)

    async def extract(self, request: Request) -> Response:
        """``POST /v1/extract/{model}``: each item's entities."""
        received = time.perf_counter_ns()
        body = await read_request(request, body_schemas.EXTRACT, self.max_bytes)
        params = body.get("params") or {}
        items = body["items"]

        def no_schema(name: str, contract: TextContract) -> None:
            if "output_schema" in params:
                raise InvalidInput(f"model '{name}' extracts entities; it does not support output_schema")
            if "labels" in params and not params["labels"]:
                raise InvalidInput("params.labels must name at least one entity type when given")
            _check(name, items, params.get("options"))

        texts: dict[InputKind, Sequence[str]] = {InputKind.TEXT: _texts(items)}
        if params.get("labels"):
            texts[InputKind.LABELS] = params["labels"]
        parameters = _parameters(None, params.get("options"))
        if "aggregation_strategy" in params:
            parameters["aggregation_strategy"] = params["aggregation_strategy"]
        call = Call(request, texts, [(OutputKind.ENTITIES, None)], parameters, check=no_schema)
        arrays, report = await self.run(call, "extract")
        found = arrays[call.outputs[OutputKind.ENTITIES].values]
        results = [{**_echo_id(item, i, default=True), "entities": json.loads(entities), "relations": [],
                    "classifications": []} for i, (item, entities) in enumerate(zip(items, found, strict=True))]
        return _answer(request, {"model": call.name, "items": results}, report, received)

    async def healthz(self, _: Request) -> Response:
        """``GET /healthz``: the process is up."""
        return JSONResponse("ok")

    async def readyz(self, _: Request) -> Response:
        """``GET /readyz``: 200 when the server is ready, else 503."""
        ready = self.service.is_ready()
        return JSONResponse("ok" if ready else "not ready", status_code=200 if ready else 503)


def sie_routes(service: InferenceService, max_bytes: int) -> list[Route]:
    """The routes of the SIE HTTP API (``/v1/embeddings`` and ``/v1/models`` are in ``embeddings``)."""
    return SieRoutes(service, max_bytes).routes()


def _answer(request: Request, content: dict[str, Any], report: RequestReport, received: int) -> Response:
    content["timing"], headers = semantic_timing(request.headers, report, received)
    return render(request, content, headers=headers)


def _texts(items: list[dict[str, Any]]) -> list[str]:
    return [item["text"] for item in items]


def _parameters(instruction: str | None, options: dict[str, Any] | None, params: dict[str, Any] | None = None
                ) -> dict[str, str]:
    """The request parameters of SIE's ``instruction`` and ``options.overflow_policy``, and of the
    encode params ``truncate``, ``truncation_direction`` and ``prompt_name``.

    Raises:
        InvalidInput: both ``truncate`` and ``options.overflow_policy`` -> 400 INVALID_INPUT.
    """
    params = params or {}
    parameters = prompt_parameters(instruction, params.get("prompt_name"))
    if options and "overflow_policy" in options:
        if "truncate" in params:
            raise InvalidInput("give params.truncate or params.options.overflow_policy, not both")
        parameters["overflow_policy"] = options["overflow_policy"]
    parameters.update(truncation(params.get("truncate"), params.get("truncation_direction")))
    return parameters


def _check(name: str, items: list[dict[str, Any]], options: dict[str, Any] | None) -> None:
    """Refuse items with images, and SIE's ``options.profile`` and ``options.lora``: no served
    model has profiles or LoRA adapters (its ModelInfo lists ``profiles: {}``).

    Raises:
        InvalidInput: any of them -> 400 INVALID_INPUT.
    """
    for index, item in enumerate(items):
        if item.get("images"):
            raise InvalidInput(f"item {index} has images; text models take text only")
    options = options or {}
    if "profile" in options:
        raise InvalidInput(f"unknown profile '{options['profile']}' for model '{name}': it has no profiles")
    if "lora" in options:
        raise InvalidInput(f"unknown LoRA adapter '{options['lora']}' for model '{name}': it has no LoRA adapters")


def _echo_id(item: dict[str, Any], index: int, default: bool) -> dict[str, Any]:
    if "id" in item:
        return {"id": item["id"]}
    return {"id": f"item-{index}"} if default else {}
