"""JSON Schemas of the semantic request bodies (SIE's HTTP API reference; OpenAI's embeddings API;
the rerank bodies of Cohere's and Jina's APIs; a tokenize body after vLLM's and TEI's).

One source for two uses: ``sie_codec`` validates every request against them (``fastjsonschema``
first, ``jsonschema`` for the error text), and ``openapi`` publishes them. The subset used is
valid in OpenAPI 3.0.
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
# Cohere's ``truncate`` (NONE, START, END) and TEI's (a boolean), with TEI's truncation_direction
TRUNCATE: dict[str, Any] = {
    "description": "false or NONE: an input over the model's max_sequence_length is an error naming its token count "
                   "and the limit; true or END: cut its end; START: cut its start",
    "oneOf": [{"type": "boolean"}, {"type": "string", "enum": ["NONE", "START", "END", "none", "start", "end"]}]}
TRUNCATION_DIRECTION: dict[str, Any] = {"type": "string", "enum": ["Right", "Left", "right", "left"],
                                        "description": "with truncate true: Right cuts the end (default), Left the start"}
PROMPT_NAME: dict[str, Any] = {"type": "string", "enum": ["document", "query"],
                               "description": "which prefix of the model's config the texts get (default document)"}

ENCODE: dict[str, Any] = {"type": "object", "required": ["items"], "properties": {
    "items": ITEMS,
    "params": {"type": "object", "properties": {
        "output_types": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": list(OUTPUT_TYPES)}},
        "instruction": {"type": "string"},
        "output_dtype": {"type": "string", "enum": list(OUTPUT_DTYPES)},
        "truncate": TRUNCATE, "truncation_direction": TRUNCATION_DIRECTION, "prompt_name": PROMPT_NAME,
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
    "user": {"type": "string"},
    "truncate": TRUNCATE, "truncation_direction": TRUNCATION_DIRECTION, "prompt_name": PROMPT_NAME,
    "instruction": {"type": "string", "description": "goes ahead of the prefix prompt_name chooses (SIE's instruction, as "
                                                     "/v1/encode takes it)"}}}
DOCUMENT: dict[str, Any] = {"oneOf": [
    {"type": "string"},
    {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}]}
# null values are dropped before the check (Cohere's clients send "max_tokens_per_doc": null)
RERANK: dict[str, Any] = {"type": "object", "required": ["query", "documents"], "properties": {
    "model": {"type": "string", "description": "repository name or alias; optional when one model gives scores"},
    "query": {"type": "string"},
    "documents": {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": DOCUMENT,
                  "description": "strings, or objects with text (Cohere v1, Jina)"},
    "top_n": {"type": "integer", "description": "the best N only; missing, 0 or negative: all (as vLLM)"},
    "return_documents": {"type": "boolean", "description": "add document.text to each result (default false)"},
    "max_tokens_per_doc": {"type": "integer", "minimum": 1, "description": "cut each document to N tokens (Cohere v2)"},
    "truncate": TRUNCATE, "truncation_direction": TRUNCATION_DIRECTION,
    "instruction": {"type": "string", "description": "prefixes the query (SIE's instruction)"},
    "rank_fields": {"type": "array", "items": {"type": "string"}, "description": "accepted; documents are text"},
    "priority": {"type": "integer", "description": "accepted and ignored (Cohere)"}}}
TOKENIZE: dict[str, Any] = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string"},
    "input": {"description": "a string or a list of strings",
              "oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": {"type": "string"}}]},
    "prompt": {"type": "string", "description": "vLLM's name for a single input"},
    "add_special_tokens": {"type": "boolean", "description": "default true"},
    "prompt_name": PROMPT_NAME},
    "oneOf": [{"required": ["input"]}, {"required": ["prompt"]}]}
