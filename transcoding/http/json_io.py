"""JSON text in and out of the REST front end: orjson first, the standard library for what orjson
refuses or would write differently, so that accepted documents and error texts stay those of the
standard library.

- ``load_json``: every JSON body (V2, Triton's extensions, the semantic routes), with Triton's
  nesting limit of 100;
- ``json_text``: the semantic routes' answers, numpy arrays and scalars included, each float32
  written as the shortest decimal that reads back as the same float32 (as text-embeddings-inference
  writes its vectors).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from kserve_v2.protocol.errors import InvalidInput

MAX_JSON_DEPTH = 100


def load_json(data: bytes | memoryview) -> Any:
    """Parse JSON, refusing nesting deeper than 100 (Triton's limit).

    orjson parses; what it refuses (NaN and Infinity literals, lone surrogates, nesting past
    its own limit, malformed text) goes through the standard library, which keeps the accepted
    documents and the error texts as they were.

    Raises:
        InvalidInput: malformed or too deeply nested JSON -> 400.
    """
    data = bytes(data) if data else b"{}"
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = _load_stdlib(data)
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH:  # nesting is bounded by the opening brackets
        _check_depth(value)
    return value


def _load_stdlib(data: bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise InvalidInput(f"JSON nesting is deeper than {MAX_JSON_DEPTH}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidInput(f"malformed JSON: {err}") from None


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidInput(f"JSON nesting is deeper than {MAX_JSON_DEPTH}")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def json_text(content: Any) -> bytes:
    """``content`` (dicts, lists, numpy arrays and scalars) as compact JSON, written by orjson.

    Contiguous numpy arrays and numpy scalars are written by orjson itself: a float32 as the
    shortest decimal that parses back to the same float32 (``0.1``, where the float64 it widens to
    would be ``0.10000000149011612``); a vector of 384 floats is about 40% shorter, and quicker to
    write and to parse. A numpy array or scalar holding NaN or Infinity goes through the standard
    library instead, which writes them as ``NaN`` and ``Infinity`` as before (orjson would write
    ``null``, so only an answer containing ``null`` is searched for them).
    """
    try:
        text = orjson.dumps(content, default=_finite_default, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return _dump_stdlib(content)
    if b"null" in text and not _numpy_finite(content):
        return _dump_stdlib(content)
    return text


def _dump_stdlib(content: Any) -> bytes:
    return json.dumps(content, separators=(",", ":"), default=_plain).encode()


def _numpy_finite(content: Any) -> bool:
    """Whether every numpy float array and scalar within ``content`` is finite."""
    stack = [content]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif _non_finite(item):
            return False
    return True


def _non_finite(value: Any) -> bool:
    """Whether ``value`` is a numpy float array or scalar holding NaN or Infinity."""
    return isinstance(value, (np.ndarray, np.floating)) and value.dtype.kind == "f" and not np.isfinite(value).all()


def _finite_default(value: Any) -> Any:
    """orjson's ``default``: refuses non-finite floats (see ``json_text``); a strided numeric array
    comes back as a contiguous copy for orjson to write itself; anything else goes to ``_plain``."""
    if _non_finite(value):
        raise TypeError("non-finite floats")
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and not value.flags.c_contiguous:
        return np.ascontiguousarray(value)
    return _plain(value)


def _plain(value: Any) -> Any:
    """``json.dumps``' ``default``: numpy arrays and scalars as plain lists and numbers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
