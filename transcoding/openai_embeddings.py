"""OpenAI's ``POST /v1/embeddings`` on the text models (``sie-http-api.txt``, OpenAI embeddings API).

``input`` is a string or a list of strings (token arrays are not taken); ``encoding_format``
``float`` (lists) or ``base64`` (little-endian float32 bytes, as the OpenAI SDK decodes them);
``dimensions`` must equal the model's width, since no served model is trained for shortened
vectors; ``usage`` counts the tokens the model processed. The request runs as one V2 request
through ``TextModels.infer``; errors use SIE's envelope like every semantic route.
"""

from __future__ import annotations

import base64
import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kserve_v2.errors import InvalidInput
from kserve_v2.service import InferenceService
from transcoding import sie_schema
from transcoding.sie import TextModels
from transcoding.sie_codec import error_response, read_request, render
from transcoding.timing import timing_headers


def embeddings_route(service: InferenceService, max_bytes: int) -> Route:
    """The ``/v1/embeddings`` route."""
    models = TextModels(service)

    async def embeddings(request: Request) -> Response:
        received, name = time.perf_counter_ns(), None
        try:
            body = await read_request(request, sie_schema.EMBEDDINGS, max_bytes)
            name = models.resolve(body["model"])
            metadata = models.require(name, "dense")
            width = next(int(o.shape[-1]) for o in metadata.outputs if o.name == "dense")
            if body.get("dimensions", width) != width:
                raise InvalidInput(f"model '{name}' gives {width}-dimensional embeddings; it cannot give "
                                   f"dimensions={body['dimensions']}")
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            arrays, report = await models.infer(request, "embeddings", name, {"text": texts}, ["dense"], {})
            vectors = arrays["dense"].astype("<f4", copy=False)
            as_base64 = body.get("encoding_format", "float") == "base64"
            data = [{"object": "embedding", "index": i,
                     "embedding": base64.b64encode(v.tobytes()).decode() if as_base64 else v.tolist()}
                    for i, v in enumerate(vectors)]
            content = {"object": "list", "model": body["model"], "data": data,
                       "usage": {"prompt_tokens": report.tokens, "total_tokens": report.tokens}}
            headers = timing_headers(report, time.perf_counter_ns() - received)
            if report.trace_id:
                headers["X-Trace-ID"] = report.trace_id
            return render(request, content, headers=headers)
        except Exception as err:  # noqa: BLE001 - every failure becomes SIE's envelope
            return error_response(request, err, name)

    return Route("/v1/embeddings", embeddings, methods=["POST"])

