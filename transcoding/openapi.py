"""The OpenAPI 3 document of every REST route (served at /api-doc/openapi.json, shown at /docs).

Kept true by ``tests/server/test_rest_docs.py``, which compares it with the application's routes and
fuzzes the server with schemathesis from it. Shapes follow the V2 protocol
(KServe's Open Inference Protocol) and Triton's extensions.
"""

from __future__ import annotations

from typing import Any

from kserve_v2 import __version__
from kserve_v2.protocol import datatypes
from transcoding.semantic import body_schemas

_ERROR = {"$ref": "#/components/schemas/Error"}
_DIMS = {"type": "array", "items": {"type": "integer", "minimum": 0}}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "invalid request", 404: "unknown model or version", 413: "request over --http-max-input-size",
            500: "execution or load failure", 501: "unsupported feature",
            503: "model not ready, control mode, exiting, or a full queue (with Retry-After)"}
    return {str(code): _json(_ERROR, text[code]) for code in codes}


def _parameters(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[^/]+$"}} for n in names]


def _health(key: str, what: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {key: {"type": "boolean"}}, "required": [key]}
    return {"get": {"summary": what, "responses": {"200": _json(schema, "true"), "400": _json(schema, "false")}}}


def _model_routes(prefix: str, names: tuple[str, ...]) -> dict[str, Any]:
    params = _parameters(*names)
    ready = {"type": "object", "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}
    return {
        prefix: {"get": {"summary": "Model metadata", "parameters": params, "responses": {
            "200": _json({"$ref": "#/components/schemas/ModelMetadata"}), **_errors(400, 404, 503)}}},
        prefix + "/ready": {"get": {"summary": "Model readiness", "parameters": params, "responses": {
            "200": _json(ready, "ready"), "400": _json(ready, "not ready")}}},
        prefix + "/config": {"get": {"summary": "Model configuration (Triton's ModelConfig JSON)", "parameters": params,
                                     "responses": {"200": _json({"type": "object"}), **_errors(400, 404, 503)}}},
        prefix + "/stats": {"get": {"summary": "Inference statistics of the model", "parameters": params,
                                    "responses": {"200": _json({"$ref": "#/components/schemas/Statistics"}),
                                                  **_errors(400, 404, 503)}}},
        prefix + "/infer": {"post": {
            "summary": "Inference (JSON, or Triton's binary tensor data extension)", "parameters": params + [{
                "name": "Inference-Header-Content-Length", "in": "header", "required": False,
                "description": "length of the JSON header when binary tensor data follows it; 0 for a raw binary body",
                "schema": {"type": "integer", "minimum": 0}}],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
            "responses": {"200": {"description": "outputs; binary ones follow the JSON header", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/InferResponse"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                **_errors(400, 404, 413, 500, 501, 503)}}},
        prefix + "/generate": {"post": {
            "summary": "Triton's generate extension: JSON keys as input tensors or parameters, the model's one "
                       "response as a flat JSON object", "parameters": params, "requestBody": _generate_body(),
            "responses": {"200": _json({"$ref": "#/components/schemas/GenerateResponse"}),
                          **_errors(400, 404, 413, 500, 501, 503)}}},
        prefix + "/generate_stream": {"post": {
            "summary": "Triton's generate extension, streamed: every response as a Server-Sent Event "
                       "(data: <GenerateResponse JSON>, or data: {\"error\": ...}); the status is the first event's",
            "parameters": params, "requestBody": _generate_body(),
            "responses": {"200": {"description": "Server-Sent Events", "content": {
                "text/event-stream": {"schema": {"type": "string"}}}}, **_errors(400, 404, 413, 500, 501, 503)}}},
    }


def _generate_body() -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/GenerateRequest"}}}}


def _extension_routes() -> dict[str, Any]:
    """Triton's trace, logging and CUDA shared memory extensions."""
    trace = {"type": "object", "description": "trace_level (array of OFF, TIMESTAMPS, TENSORS), trace_rate, "
                                              "trace_count, log_frequency (strings); null clears a setting",
             "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}}
    logs = {"type": "object", "description": "log_info, log_warning, log_error (booleans), log_verbose_level "
                                             "(uint32), log_format (default or ISO8601)",
            "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "boolean"}, {"type": "integer"}]}}

    def get_post(summary: str, schema: dict[str, Any], parameters: list[dict[str, Any]],
                 codes: tuple[int, ...]) -> dict[str, Any]:
        answer = {"200": _json(schema), **_errors(*codes)}
        return {"get": {"summary": summary, "parameters": parameters, "responses": answer},
                "post": {"summary": summary + ": update the given ones", "parameters": parameters,
                         "requestBody": {"required": False, "content": {"application/json": {"schema": schema}}},
                         "responses": answer}}

    region = _parameters("region")
    cuda_region = {"type": "object", "properties": {"name": {"type": "string"}, "device_id": {"type": "integer"},
                                                    "byte_size": {"type": "integer"}}}
    status = {"summary": "Registered CUDA shared memory regions (none: registering is not supported)",
              "responses": {"200": _json({"type": "array", "items": cuda_region}), **_errors(404)}}
    unregister = {"summary": "Unregister CUDA shared memory (all regions, or one)",
                  "responses": {"200": _json({"type": "object"})}}
    paths: dict[str, Any] = {
        "/v2/trace/setting": get_post("Global trace settings", trace, [], (400, 413, 501)),
        "/v2/logging": get_post("Log settings", logs, [], (400, 413, 501, 503)),
        "/v2/cudasharedmemory/status": {"get": status},
        "/v2/cudasharedmemory/region/{region}/status": {"get": {**status, "parameters": region}},
        "/v2/cudasharedmemory/unregister": {"post": unregister},
        "/v2/cudasharedmemory/region/{region}/unregister": {"post": {**unregister, "parameters": region}},
        "/v2/cudasharedmemory/region/{region}/register": {"post": {
            "summary": "Register a CUDA IPC handle: answers 400 'GPUs not supported' (Triton without GPU support)",
            "parameters": region, "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["raw_handle", "byte_size"], "properties": {
                    "raw_handle": {"type": "object", "properties": {"b64": {"type": "string"}}},
                    "device_id": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 0}}}}}},
            "responses": {"200": _json({"type": "object"}), **_errors(400, 413)}}},
    }
    for prefix, names in (("/v2/models/{model}", ("model",)), ("/v2/models/{model}/versions/{version}", ("model", "version"))):
        paths[prefix + "/trace/setting"] = get_post("Trace settings of one model", trace, _parameters(*names),
                                                    (400, 413, 501))
    return paths


def _negotiated(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    """A semantic answer: msgpack by default, JSON with ``Accept: application/json``."""
    return {"description": description, "content": {"application/msgpack": {"schema": schema},
                                                    "application/json": {"schema": schema}}}


def _sie_errors(*codes: int) -> dict[str, Any]:
    text = {400: "INVALID_INPUT or INPUT_TOO_LONG", 404: "MODEL_NOT_FOUND", 413: "request over --http-max-input-size",
            500: "INFERENCE_ERROR", 503: "MODEL_NOT_LOADED"}
    return {str(code): _negotiated({"$ref": "#/components/schemas/SieError"}, text[code]) for code in codes}


def _openai(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    """An OpenAI-route answer: JSON by default, msgpack with ``Accept: application/msgpack``."""
    return {"description": description, "content": {"application/json": {"schema": schema},
                                                    "application/msgpack": {"schema": schema}}}


def _openai_errors(*codes: int, schema: str = "OpenAIError") -> dict[str, Any]:
    text = {400: "invalid_request_error (context_length_exceeded for an over-long input)",
            404: "invalid_request_error, code model_not_found", 413: "request over --http-max-input-size",
            500: "server_error", 503: "server_error: model not loaded or a full queue (with Retry-After)"}
    return {str(code): _openai({"$ref": f"#/components/schemas/{schema}"}, text[code]) for code in codes}


def _semantic_routes() -> dict[str, Any]:
    model = [{"name": "model", "in": "path", "required": True, "description": "repository name or alias (may hold a slash)",
              "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)?$"}}]
    errors = _sie_errors(400, 404, 413, 500, 503)
    openai_errors = _openai_errors(400, 404, 413, 500, 503)
    obj = {"type": "object"}

    def post(summary: str, schema: dict[str, Any], parameters: list[dict[str, Any]]) -> dict[str, Any]:
        return {"post": {"summary": summary, "parameters": parameters, "requestBody": {
            "required": True, "description": "JSON, or msgpack with Content-Type: application/msgpack",
            "content": {"application/json": {"schema": schema}}}, "responses": {"200": _negotiated(obj), **errors}}}

    text = {"200": {"description": "ok", "content": {"application/json": {"schema": {"type": "string"}}}}}
    return {
        "/v1/encode/{model}": post("Dense, sparse or multivector embeddings of text items", body_schemas.ENCODE, model),
        "/v1/score/{model}": post("Score items against a query, sorted, with rank", body_schemas.SCORE, model),
        "/v1/extract/{model}": post("Entities (character spans) in text items", body_schemas.EXTRACT, model),
        "/v1/embeddings": {"post": {
            "summary": "OpenAI-compatible embeddings (input: string, strings, token ids, or lists of token ids)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": body_schemas.EMBEDDINGS}}},
            "responses": {"200": _openai(obj), **openai_errors}}},
        "/v1/tokenize": {"post": {
            "summary": "Token ids, counts, offsets and special flags of each input, untruncated, with the model's max_model_len",
            "requestBody": {"required": True, "content": {"application/json": {"schema": body_schemas.TOKENIZE}}},
            "responses": {"200": _openai(obj), **openai_errors}}},
        **{path: {"post": {
            "summary": "Rerank documents against a query (Cohere v1/v2, Jina and vLLM bodies; results best first)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": body_schemas.RERANK}}},
            "responses": {"200": _openai(obj), **_openai_errors(400, 404, 413, 500, 503, schema="RerankError")}}}
          for path in ("/v1/rerank", "/v2/rerank", "/rerank")},
        "/v1/models": {"get": {"summary": "Text models, loaded or not: OpenAI's list (object, data) and SIE's (models)",
                               "responses": {"200": _openai(obj), **_openai_errors(500)}}},
        "/v1/models/{model}": {"get": {"summary": "One text model: OpenAI's Model beside SIE's ModelInfo",
                                       "parameters": model, "responses": {"200": _openai(obj), **_openai_errors(404, 500)}}},
        "/healthz": {"get": {"summary": "Liveness (SIE)", "responses": text}},
        "/readyz": {"get": {"summary": "Readiness (SIE)", "responses": {
            **text, "503": {"description": "not ready", "content": {"application/json": {"schema": {"type": "string"}}}}}}},
    }


def _schemas() -> dict[str, Any]:
    tensor_meta = {"type": "object", "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
                                                    "shape": {"type": "array", "items": {"type": "integer"}}}}
    parameters = {"type": "object", "additionalProperties": {"oneOf": [
        {"type": "string"}, {"type": "number"}, {"type": "boolean"}]}}
    request_input = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"type": "string"}, "shape": _DIMS, "datatype": {"type": "string", "enum": [d.v2 for d in datatypes.TABLE]},
        "parameters": parameters, "data": {"type": "array", "items": {}}}}
    duration = {"type": "object", "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}}}
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"], "properties": {
                "message": {"type": "string"}, "type": {"type": "string"},
                "param": {"type": "string", "nullable": True}, "code": {"type": "string", "nullable": True}}}}},
        "RerankError": {"allOf": [{"$ref": "#/components/schemas/OpenAIError"}, {
            "type": "object", "required": ["detail"], "properties": {"detail": {
                "type": "string", "description": "the message again: the error body of Jina's reranker API"}}}]},
        "SieError": {"type": "object", "required": ["detail"], "properties": {"detail": {
            "type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}, "model": {"type": "string"}}}}},
        "ServerMetadata": {"type": "object", "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                                            "extensions": {"type": "array", "items": {"type": "string"}}}},
        "ModelMetadata": {"type": "object", "properties": {
            "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"}, "inputs": {"type": "array", "items": tensor_meta},
            "outputs": {"type": "array", "items": tensor_meta}}},
        "InferRequest": {"type": "object", "required": ["inputs"], "properties": {
            "id": {"type": "string"}, "parameters": parameters, "inputs": {"type": "array", "items": request_input},
            "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "parameters": parameters}}}}},
        "InferResponse": {"type": "object", "properties": {
            "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}}, "parameters": parameters,
                "data": {"type": "array", "items": {}}}}}}},
        "GenerateRequest": {"type": "object", "description": "keys naming a model input are its tensor (a scalar or a "
                            "flat array); other keys, and those of 'parameters', are request parameters",
                            "properties": {"id": {"type": "string"}, "text_input": {"type": "string"},
                                           "parameters": parameters},
                            "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"},
                                                               {"type": "array", "items": {}}]}},
        "GenerateResponse": {"type": "object", "description": "each output by name: a scalar, or a flat array",
                             "properties": {"id": {"type": "string"}, "model_name": {"type": "string"},
                                            "model_version": {"type": "string"}},
                             "additionalProperties": {}},
        "Statistics": {"type": "object", "properties": {"model_stats": {"type": "array", "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                             "inference_count": {"type": "integer"}, "execution_count": {"type": "integer"},
                                             "inference_stats": {"type": "object", "additionalProperties": duration}}}}}},
        "IndexEntry": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "version": {"type": "string"}, "reason": {"type": "string"},
            "state": {"type": "string", "enum": ["READY", "UNAVAILABLE", "LOADING", "UNLOADING"]}}},
        "RepositoryRequest": {"type": "object", "properties": {"parameters": {
            "type": "object", "description": "load: 'config' (ModelConfig JSON) and 'file:<path>' (base64); "
                                             "unload: 'unload_dependents' (boolean)",
            "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "boolean"}]}}}},
    }


def openapi_document(metrics: bool, status: bool) -> dict[str, Any]:
    """The OpenAPI 3.0 document of the REST API (``metrics``: /metrics is served; ``status``: /status)."""
    paths: dict[str, Any] = {
        "/": _health("live", "Liveness (same as /v2/health/live)"),
        "/v2/health/live": _health("live", "Liveness: the process serves requests"),
        "/v2/health/ready": _health("ready", "Readiness: startup models READY and not draining"),
        "/v2": {"get": {"summary": "Server metadata", "responses": {
            "200": _json({"$ref": "#/components/schemas/ServerMetadata"})}}},
        "/v2/models/stats": {"get": {"summary": "Inference statistics of every model", "responses": {
            "200": _json({"$ref": "#/components/schemas/Statistics"})}}},
        "/v2/repository/index": {"post": {
            "summary": "Every model folder with its versions' states", "requestBody": {"required": False, "content": {
                "application/json": {"schema": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}},
            "responses": {"200": _json({"type": "array", "items": {"$ref": "#/components/schemas/IndexEntry"}}),
                          **_errors(400, 413)}}},
        "/docs": {"get": {"summary": "This API, in Swagger UI", "responses": {
            "200": {"description": "HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
        "/api-doc/openapi.json": {"get": {"summary": "This document", "responses": {"200": _json({"type": "object"})}}},
    }
    for action, what in (("load", "Load or reload a model (explicit control mode)"),
                         ("unload", "Unload a model after its in-flight requests (explicit control mode)")):
        paths[f"/v2/repository/models/{{model}}/{action}"] = {"post": {
            "summary": what, "parameters": _parameters("model"), "requestBody": {"required": False, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/RepositoryRequest"}}}},
            "responses": {"200": _json({"type": "object"}), **_errors(400, 404, 413, 500, 503)}}}
    region = _parameters("region")
    shm_region = {"type": "object", "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                                                   "offset": {"type": "integer"}, "byte_size": {"type": "integer"}}}
    shm_status = {"summary": "Registered system shared memory regions (empty while --allow-client-shm is off)",
              "responses": {"200": _json({"type": "array", "items": shm_region}), **_errors(404)}}
    unregister = {"summary": "Unregister system shared memory (all regions, or one)",
                  "responses": {"200": _json({"type": "object"})}}
    paths["/v2/systemsharedmemory/status"] = {"get": shm_status}
    paths["/v2/systemsharedmemory/region/{region}/status"] = {"get": {**shm_status, "parameters": region}}
    paths["/v2/systemsharedmemory/unregister"] = {"post": unregister}
    paths["/v2/systemsharedmemory/region/{region}/unregister"] = {"post": {**unregister, "parameters": region}}
    paths["/v2/systemsharedmemory/region/{region}/register"] = {"post": {
        "summary": "Register byte_size bytes of the POSIX shared memory object key from offset (--allow-client-shm)",
        "parameters": region, "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["key", "byte_size"], "properties": {
                "key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                "byte_size": {"type": "integer", "minimum": 0}}}}}},
        "responses": {"200": _json({"type": "object"}), **_errors(400, 413)}}}
    paths.update(_extension_routes())
    if metrics:
        paths["/metrics"] = {"get": {"summary": "Prometheus metrics: OpenMetrics when Accept asks for "
                                                "application/openmetrics-text, else the text format", "responses": {
            "200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}},
                                                          "application/openmetrics-text": {"schema": {"type": "string"}}}}}}}
    if status:
        paths["/status"] = {"get": {"summary": "Live status page (models, requests/s, latency; draws /ws/status, "
                                               "a WebSocket sending the status object every 200 ms)", "responses": {
            "200": {"description": "HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}}}}
    paths.update(_model_routes("/v2/models/{model}", ("model",)))
    paths.update(_model_routes("/v2/models/{model}/versions/{version}", ("model", "version")))
    paths.update(_semantic_routes())
    return {"openapi": "3.0.3",
            "info": {"title": "kserve_v2", "version": __version__,
                     "description": "KServe V2 / Open Inference Protocol REST API with Triton's extensions, "
                                    "and the semantic endpoints (SIE's HTTP API, OpenAI embeddings, rerank, tokenize)."},
            "paths": paths, "components": {"schemas": _schemas()}}
