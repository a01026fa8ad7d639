"""The semantic endpoints of SIE's HTTP API reference: encode, score, extract, health; ``TextModels``.

Each route turns its body into a ``ModelInferRequest`` with BYTES text inputs, calls the same
``InferenceService.model_infer_reported`` as gRPC, and reshapes the output tensors into SIE's
response. No inference happens here: the text models are repository models (``adapters/``)
whose V2 interface names what they can do (``dense``, ``sparse_values``, ``multivector``,
``scores``, ``entities`` outputs). A model is addressed by its repository name, or by the
``alias`` parameter of its config (``sentence-transformers/all-MiniLM-L6-v2``; a slash is fine).
Every body carries SIE's ``timing`` and every answer ``X-Trace-ID`` (``transcoding.timing``).
``/v1/models`` lives with the OpenAI routes (``openai_embeddings``), which answer both shapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.datatypes import BY_V2, BYTES
from kserve_v2.errors import InvalidInput, NotFound, NotLoaded, ServerError
from kserve_v2.service import InferenceService, RequestReport
from kserve_v2.tensors import from_raw, pack_bytes
from transcoding import sie_schema
from transcoding.sie_codec import error_response, read_request, render
from transcoding.timing import response_headers, timing_body, trace_id

# SIE output type -> the output tensor that carries it
CAPABILITIES = {"dense": "dense", "sparse": "sparse_values", "multivector": "multivector", "score": "scores",
                "entities": "entities"}
# a text backend (config.pbtxt) -> the SIE outputs it offers, for models that are not loaded
BACKEND_OUTPUTS = {"text_embedding": ("dense", "score"), "text_sparse": ("sparse", "score"), "text_rerank": ("score",),
                   "text_extraction": ("entities",)}
# output_dtype -> the dense output tensor of that precision
DENSE_OUTPUTS = {"float32": "dense", "float16": "dense_fp16", "int8": "dense_int8", "binary": "dense_binary"}
Handler = Callable[[Request], Awaitable[Response]]


class TextModels:
    """Calls text models through the service: name resolution, requests, outputs."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    def resolve(self, name: str) -> str:
        """The repository name of ``name`` (itself, or the model whose ``alias`` parameter it is),
        loaded or not.

        Raises:
            NotFound: no such model -> 404 MODEL_NOT_FOUND.
        """
        if self.service.has_model(name) or self.service.stored_config(name) is not None:
            return name
        for model in self.names():
            config = self.service.stored_config(model)
            if config is not None and "alias" in config.parameters and config.parameters["alias"].string_value == name:
                return model
        raise NotFound(f"Model '{name}' not found")

    def names(self) -> list[str]:
        """Every model of the repository (loaded or not), by name."""
        return list(dict.fromkeys(row.name for row in self.service.repository_index(pb.RepositoryIndexRequest()).models))

    def interface(self, name: str) -> pb.ModelMetadataResponse:
        """The model's V2 interface.

        Raises:
            NotLoaded: a repository model with no READY version (unloaded, loading, failed) ->
                503 MODEL_NOT_LOADED with Retry-After, SIE's answer (V2 says NOT_FOUND, as Triton does).
            NotFound: no such model -> 404 MODEL_NOT_FOUND.
        """
        try:
            return self.service.model_metadata(pb.ModelMetadataRequest(name=name))
        except NotFound as err:
            if self.service.has_model(name) or self.service.stored_config(name) is not None:
                raise NotLoaded(f"Model '{name}' is not loaded: {err}") from None
            raise

    def info(self, name: str) -> dict[str, Any] | None:
        """SIE's ModelInfo of a text model, loaded or not (``loaded``); None for other models.

        A loaded model's outputs and dims come from its V2 interface; an unloaded one's outputs
        from its backend, with no dims (SIE's listing shows ``dims: {}`` for such models).
        """
        config = self.service.stored_config(name)
        try:
            metadata: pb.ModelMetadataResponse | None = self.service.model_metadata(pb.ModelMetadataRequest(name=name))
        except ServerError:
            metadata = None
        if metadata is not None:
            offered = capabilities(metadata)
            widths = {o.name: int(o.shape[-1]) for o in metadata.outputs}
            dims = {kind: widths[kind] for kind in ("dense", "multivector") if kind in offered}
        elif config is not None and config.backend in BACKEND_OUTPUTS:
            offered, dims = list(BACKEND_OUTPUTS[config.backend]), {}
        else:
            return None
        if not offered:
            return None
        parameters = {key: value.string_value for key, value in config.parameters.items()} if config else {}
        if "sparse" in offered and metadata is not None:
            dims["sparse"] = int(parameters.get("vocab_size", "0"))
        info: dict[str, Any] = {"name": name, "inputs": ["text"], "outputs": offered, "dims": dims,
                                "loaded": metadata is not None,
                                "max_sequence_length": int(parameters.get("max_sequence_length", "0")), "profiles": {}}
        if "alias" in parameters:
            info["aliases"] = [parameters["alias"]]
        return info

    def require(self, name: str, capability: str) -> pb.ModelMetadataResponse:
        """The interface, checked to offer ``capability`` (a key of ``CAPABILITIES``).

        Raises:
            InvalidInput: the model does not produce it -> 400 INVALID_INPUT.
        """
        metadata = self.interface(name)
        offered = capabilities(metadata)
        if capability not in offered:
            raise InvalidInput(f"model '{name}' does not support '{capability}' (it supports: {', '.join(offered) or 'none'})")
        return metadata

    async def infer(self, request: Request, endpoint: str, name: str, texts: dict[str, Sequence[str]],
                    outputs: Sequence[str], parameters: dict[str, str]) -> tuple[dict[str, np.ndarray], RequestReport]:
        """One V2 request: BYTES [n] per text input, the named outputs, string parameters."""
        message = pb.ModelInferRequest(model_name=name)
        for tensor, values in texts.items():
            message.inputs.add(name=tensor, datatype=BYTES.v2, shape=[len(values)])
            message.raw_input_contents.append(pack_bytes(np.array(values, dtype=object)))
        for output in outputs:
            message.outputs.add(name=output)
        for key, value in parameters.items():
            message.parameters[key].string_param = value
        response, report = await self.service.model_infer_reported(message, dict(request.headers), endpoint)
        arrays = {o.name: from_raw(raw, BY_V2[o.datatype], list(o.shape), o.name)
                  for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)}
        return arrays, report


def capabilities(metadata: pb.ModelMetadataResponse) -> list[str]:
    """SIE output types a model offers, from its output tensor names (empty: not a text model)."""
    if not any(i.name == "text" and i.datatype == BYTES.v2 for i in metadata.inputs):
        return []
    names = {o.name for o in metadata.outputs}
    return [kind for kind, tensor in CAPABILITIES.items() if tensor in names]


def sie_routes(service: InferenceService, max_bytes: int) -> list[Route]:
    """The routes of the SIE HTTP API (``/v1/embeddings`` and ``/v1/models`` are in ``openai_embeddings``)."""
    models = TextModels(service)

    def route(handler: Callable[[Request, dict[str, Any]], Awaitable[Response]]) -> Handler:
        async def endpoint(request: Request) -> Response:
            received, name = time.perf_counter_ns(), request.path_params.get("model")
            state: dict[str, Any] = {"received": received}
            try:
                return await handler(request, state)
            except Exception as err:  # noqa: BLE001 - every failure becomes SIE's envelope
                response = error_response(request, err, state.get("model", name))
                response.headers["X-Trace-ID"] = trace_id(request.headers)
                return response
        return endpoint

    def answer(request: Request, state: dict[str, Any], content: dict[str, Any], report: RequestReport) -> Response:
        total = time.perf_counter_ns() - state["received"]
        content["timing"] = timing_body(report, total)
        return render(request, content, headers=response_headers(request.headers, report, total))

    def resolve(request: Request, state: dict[str, Any]) -> str:
        name = state["model"] = request.state.model = models.resolve(request.path_params["model"])
        return name

    async def encode(request: Request, state: dict[str, Any]) -> Response:
        body = await read_request(request, sie_schema.ENCODE, max_bytes)
        name = resolve(request, state)
        params = body.get("params") or {}
        kinds = list(dict.fromkeys(params.get("output_types") or ["dense"]))
        dtype = params.get("output_dtype", "float32")
        metadata = models.interface(name)
        offered = capabilities(metadata)
        for kind in kinds:
            if kind not in offered:
                raise InvalidInput(f"model '{name}' does not produce '{kind}' outputs (it produces: {', '.join(offered) or 'none'})")
        if dtype != "float32" and kinds != ["dense"]:
            raise InvalidInput(f"output_dtype '{dtype}' applies to dense outputs only; ask for float32 with {kinds}")
        tensors = {"dense": [DENSE_OUTPUTS[dtype]], "sparse": ["sparse_indices", "sparse_values", "sparse_lengths"],
                   "multivector": ["multivector", "multivector_lengths"]}
        wanted = [t for kind in kinds for t in tensors[kind]]
        items = body["items"]
        arrays, report = await models.infer(request, "encode", name, {"text": _texts(items)}, wanted,
                                            _parameters(name, params.get("instruction"), params.get("options")))
        dims = {o.name: o.shape[-1] for o in metadata.outputs}
        results = [_echo_id(item, i, default=False) for i, item in enumerate(items)]
        if "dense" in kinds:
            for result, row in zip(results, arrays[DENSE_OUTPUTS[dtype]], strict=True):
                result["dense"] = {"dims": dims["dense"], "dtype": dtype, "values": row}
        if "sparse" in kinds:
            vocab = _config_parameter(service, name, "vocab_size")
            bounds = np.concatenate([[0], np.cumsum(arrays["sparse_lengths"])])
            for i, result in enumerate(results):
                part = slice(bounds[i], bounds[i + 1])
                result["sparse"] = {"dims": int(vocab), "dtype": "float32", "indices": arrays["sparse_indices"][part],
                                    "values": arrays["sparse_values"][part]}
        if "multivector" in kinds:
            bounds = np.concatenate([[0], np.cumsum(arrays["multivector_lengths"])])
            for i, result in enumerate(results):
                vectors = arrays["multivector"][bounds[i]:bounds[i + 1]]
                result["multivector"] = {"token_dims": dims["multivector"], "num_tokens": len(vectors),
                                         "dtype": "float32", "values": vectors}
        return answer(request, state, {"model": name, "items": results}, report)

    async def score(request: Request, state: dict[str, Any]) -> Response:
        body = await read_request(request, sie_schema.SCORE, max_bytes)
        name = resolve(request, state)
        models.require(name, "score")
        items = body["items"]
        arrays, report = await models.infer(
            request, "score", name, {"query": [body["query"]["text"]], "text": _texts(items)}, ["scores"],
            _parameters(name, body.get("instruction"), body.get("options")))
        order = sorted(range(len(items)), key=lambda i: -float(arrays["scores"][i]))
        scores = [{"item_id": items[i].get("id"), "score": float(arrays["scores"][i]), "rank": rank}
                  for rank, i in enumerate(order)]
        return answer(request, state, {"model": name, "query_id": body["query"].get("id"), "scores": scores}, report)

    async def extract(request: Request, state: dict[str, Any]) -> Response:
        body = await read_request(request, sie_schema.EXTRACT, max_bytes)
        name = resolve(request, state)
        models.require(name, "entities")
        params = body.get("params") or {}
        if "output_schema" in params:
            raise InvalidInput(f"model '{name}' extracts entities; it does not support output_schema")
        items = body["items"]
        texts: dict[str, Sequence[str]] = {"text": _texts(items)}
        if "labels" in params:
            if not params["labels"]:
                raise InvalidInput("params.labels must name at least one entity type when given")
            texts["labels"] = params["labels"]
        parameters = _parameters(name, None, params.get("options"))
        if "aggregation_strategy" in params:
            parameters["aggregation_strategy"] = params["aggregation_strategy"]
        arrays, report = await models.infer(request, "extract", name, texts, ["entities"], parameters)
        results = [{**_echo_id(item, i, default=True), "entities": json.loads(found), "relations": [],
                    "classifications": []}
                   for i, (item, found) in enumerate(zip(items, arrays["entities"], strict=True))]
        return answer(request, state, {"model": name, "items": results}, report)

    async def healthz(_: Request) -> Response:
        return JSONResponse("ok")

    async def readyz(_: Request) -> Response:
        ready = service.is_ready()
        return JSONResponse("ok" if ready else "not ready", status_code=200 if ready else 503)

    return [
        Route("/v1/encode/{model:path}", route(encode), methods=["POST"]),
        Route("/v1/score/{model:path}", route(score), methods=["POST"]),
        Route("/v1/extract/{model:path}", route(extract), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]


def _texts(items: list[dict[str, Any]]) -> list[str]:
    for index, item in enumerate(items):
        if item.get("images"):
            raise InvalidInput(f"item {index} has images; text models take text only")
    return [item["text"] for item in items]


def _parameters(name: str, instruction: str | None, options: dict[str, Any] | None) -> dict[str, str]:
    """The request parameters of SIE's ``instruction`` and ``options``.

    Raises:
        InvalidInput: ``options.profile`` or ``options.lora``: no served model has profiles or LoRA
            adapters (its ModelInfo lists ``profiles: {}``) -> 400 INVALID_INPUT.
    """
    parameters = {}
    if instruction:
        parameters["instruction"] = instruction
    options = options or {}
    if "profile" in options:
        raise InvalidInput(f"unknown profile '{options['profile']}' for model '{name}': it has no profiles")
    if "lora" in options:
        raise InvalidInput(f"unknown LoRA adapter '{options['lora']}' for model '{name}': it has no LoRA adapters")
    if "overflow_policy" in options:
        parameters["overflow_policy"] = options["overflow_policy"]
    return parameters


def _echo_id(item: dict[str, Any], index: int, default: bool) -> dict[str, Any]:
    if "id" in item:
        return {"id": item["id"]}
    return {"id": f"item-{index}"} if default else {}


def _config_parameter(service: InferenceService, name: str, key: str) -> str:
    parameters = service.model_config(pb.ModelConfigRequest(name=name)).config.parameters
    return parameters[key].string_value if key in parameters else "0"
