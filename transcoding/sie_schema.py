"""JSON Schemas of the semantic request bodies (SIE's HTTP API reference; OpenAI's embeddings API).

One source for two uses: ``sie_codec`` validates every request against them with the
``jsonschema`` library, and ``openapi`` publishes them. The subset used is valid in OpenAPI 3.0.
"""

from __future__ import annotations

from typing import Any

OUTPUT_TYPES = ("dense", "sparse", "multivector")
OUTPUT_DTYPES = ("float32", "float16", "int8", "binary")
OVERFLOW_POLICIES = ("default", "truncate_text", "error")
AGGREGATION_STRATEGIES = ("simple", "first", "max", "average", "none")
MAX_ITEMS = 4096

ITEM: dict[str, Any] = {"type": "object", "required": ["text"], "properties": {
    "id": {"type": "string", "description": "client-provided ID, echoed back"},
    "text": {"type": "string"},
    "images": {"type": "array", "description": "not supported by text models"}}}
OPTIONS: dict[str, Any] = {"type": "object", "description": "runtime options", "properties": {
    "profile": {"type": "string", "description": "rejected with 400 INVALID_INPUT: no served model has profiles"},
    "lora": {"type": "string", "description": "rejected with 400 INVALID_INPUT: no served model has LoRA adapters"},
    "overflow_policy": {"type": "string", "enum": list(OVERFLOW_POLICIES),
                        "description": "default and truncate_text cut the text at the model's max_sequence_length; "
                                       "error answers INPUT_TOO_LONG"}}}
ITEMS: dict[str, Any] = {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": ITEM}

ENCODE: dict[str, Any] = {"type": "object", "required": ["items"], "properties": {
    "items": ITEMS,
    "params": {"type": "object", "properties": {
        "output_types": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": list(OUTPUT_TYPES)}},
        "instruction": {"type": "string"},
        "output_dtype": {"type": "string", "enum": list(OUTPUT_DTYPES)},
        "options": OPTIONS}}}}
SCORE: dict[str, Any] = {"type": "object", "required": ["query", "items"], "properties": {
    "query": ITEM, "items": ITEMS, "instruction": {"type": "string"}, "options": OPTIONS}}
EXTRACT: dict[str, Any] = {"type": "object", "required": ["items"], "properties": {
    "items": ITEMS,
    "params": {"type": "object", "properties": {
        "labels": {"type": "array", "items": {"type": "string"}},
        "output_schema": {"type": "object", "description": "not supported by token-classification models"},
        "aggregation_strategy": {"type": "string", "enum": list(AGGREGATION_STRATEGIES),
                                 "description": "how token labels merge into entity spans, as token-classification "
                                                "pipelines do (default first)"},
        "instruction": {"type": "string"},
        "options": OPTIONS}}}}
TOKEN_IDS: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
EMBEDDINGS: dict[str, Any] = {"type": "object", "required": ["model", "input"], "properties": {
    "model": {"type": "string"},
    "input": {"description": "a string, a list of strings, a list of token ids, or a list of lists of token ids",
              "oneOf": [{"type": "string"},
                        {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": {"type": "string"}},
                        TOKEN_IDS,
                        {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": TOKEN_IDS}]},
    "encoding_format": {"type": "string", "enum": ["float", "base64"]},
    "dimensions": {"type": "integer", "minimum": 1},
    "user": {"type": "string"}}}
