"""Rerank: Cohere's ``POST /v1/rerank`` and ``/v2/rerank``, and Jina's and vLLM's ``/rerank``, on
any text model that gives scores (a cross-encoder, or an embedding or sparse model's query score).

One handler serves the three paths, as vLLM does: the body is the union of the shapes (Cohere
API reference "Rerank" v1 and v2, Jina's reranker API): ``query``; ``documents`` as strings or
``{"text"}`` objects; ``top_n`` (missing, 0 or negative: all); ``return_documents`` (default
false); ``max_tokens_per_doc`` (Cohere v2); ``truncate`` (``NONE``/``START``/``END`` or a boolean;
default END, Cohere's); ``instruction`` (prefixes the query); ``model`` (optional when exactly one
loaded text model gives scores); null fields count as missing. The answer carries Cohere's ``id``,
``results`` (``index``, ``relevance_score``, ``document``), ``meta`` and Jina's ``model`` and
``usage`` (the tokenizer's tokens), best first, plus SIE's ``timing``. It is the call behind SIE's
``/v1/score`` (``text_calls.Call.score``), run by ``TextModels.infer``; errors come in
OpenAI's envelope, as vLLM answers them (an over-long document with ``truncate: NONE``:
``context_length_exceeded``, naming its token count and the limit), with the message also as
Jina's top-level ``detail``, which Jina's clients raise.
"""

from __future__ import annotations

import time
import uuid
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kserve_v2.backend.text import OutputKind
from kserve_v2.service.inference_service import InferenceService
from transcoding.http.routes import guarded
from transcoding.http.timing import semantic_timing
from transcoding.semantic import body_schemas
from transcoding.semantic.embeddings import openai_error
from transcoding.semantic.openai_codec import InvalidField, render
from transcoding.semantic.sie_codec import read_request
from transcoding.semantic.text_calls import Call, truncation

PATHS = ("/v1/rerank", "/v2/rerank", "/rerank")


class RerankRoutes:
    """The rerank handler on one service.

    Args:
        service: the one request path.
        max_bytes: the largest request body (413 above it).
    """

    def __init__(self, service: InferenceService, max_bytes: int) -> None:
        self.service = service
        self.max_bytes = max_bytes

    def routes(self) -> list[Route]:
        """``POST`` on every path of ``PATHS``."""
        envelope = partial(openai_error, detail=True)
        return [Route(path, guarded(self.rerank, envelope), methods=["POST"]) for path in PATHS]

    async def rerank(self, request: Request) -> Response:
        """The documents ranked by relevance to the query, best first (see the module docstring)."""
        received = time.perf_counter_ns()
        body = await read_request(request, body_schemas.RERANK, self.max_bytes, drop_nulls=True)
        documents = [document if isinstance(document, str) else document["text"] for document in body["documents"]]
        parameters = truncation(body.get("truncate"), body.get("truncation_direction"))
        if "max_tokens_per_doc" in body:
            parameters["max_tokens_per_doc"] = str(body["max_tokens_per_doc"])
        if body.get("instruction"):
            parameters["instruction"] = body["instruction"]
        call = Call.score(request, body["query"], documents, parameters)
        name = body.get("model") or self.only_scorer()
        arrays, report = await self.service.text.infer(name, call, dict(request.headers), "rerank")
        scores = arrays[call.outputs[OutputKind.SCORE].values]
        order = sorted(range(len(documents)), key=lambda i: -float(scores[i]))
        if body.get("top_n", 0) > 0:
            order = order[:body["top_n"]]
        results: list[dict[str, Any]] = [{"index": i, "relevance_score": float(scores[i])} for i in order]
        if body.get("return_documents"):
            for result in results:
                result["document"] = {"text": documents[result["index"]]}
        content: dict[str, Any] = {
            "id": str(uuid.uuid4()), "model": name, "results": results, "usage": {"total_tokens": report.tokens},
            "meta": {"api_version": {"version": "2" if request.url.path.startswith("/v2/") else "1"},
                     "billed_units": {"search_units": 1}}}
        content["timing"], headers = semantic_timing(request.headers, report, received)
        return render(request, content, headers=headers)

    def only_scorer(self) -> str:
        """The model of a body without ``model``: the one loaded text model that gives scores.

        Raises:
            InvalidField: none, or several -> 400 naming them (param ``model``).
        """
        scorers = [info.name for info in self.service.text.models()
                   if info.contract is not None and OutputKind.SCORE in info.kinds]
        if len(scorers) != 1:
            raise InvalidField(f"name the model: {len(scorers)} loaded models give scores "
                               f"({', '.join(scorers) or 'none'})", "model")
        return scorers[0]


def rerank_routes(service: InferenceService, max_bytes: int) -> list[Route]:
    """The rerank routes (see ``RerankRoutes``)."""
    return RerankRoutes(service, max_bytes).routes()
