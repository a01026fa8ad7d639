"""Differential test: fastjsonschema (the fast accept path of ``sie_codec.check_schema``) and
jsonschema (whose best match words the 400) give every body the same verdict on every schema of
``transcoding.semantic.body_schemas``.

The bodies are built from each schema (every oneOf branch, enum members, lists at minItems and a
few more, integers around their minimum, integral floats: ``1.0`` is an integer to both); half of
them then have one node replaced by any JSON value (booleans, which are never integers, nulls,
property names and enum members in the wrong place, nested lists and objects).
CI runs a seeded, bounded budget; ``KSERVE_V2_FUZZ_EXAMPLES`` raises it, as for the codec.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from kserve_v2.protocol.errors import InvalidInput
from transcoding.semantic import body_schemas
from transcoding.semantic.sie_codec import _compiled, check_schema

BUDGET = int(os.environ.get("KSERVE_V2_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=BUDGET, deadline=None, derandomize=BUDGET <= 1000,
                suppress_health_check=[HealthCheck.too_slow])
SCHEMAS = {name: getattr(body_schemas, name) for name in ("ENCODE", "SCORE", "EXTRACT", "EMBEDDINGS", "RERANK", "TOKENIZE")}


def _words(value: Any) -> set[str]:
    """Every property name and enum member in a schema: the keys and strings worth trying."""
    found: set[str] = set()
    if isinstance(value, dict):
        found.update(value.get("properties", {}))
        found.update(v for v in value.get("enum", ()) if isinstance(v, str))
        found.update(value.get("required", ()))
        for child in value.values():
            found |= _words(child)
    elif isinstance(value, list):
        for child in value:
            found |= _words(child)
    return found


WORDS = sorted(set().union(*map(_words, SCHEMAS.values())))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 0.0, 2.5, -1.0]),
                    st.sampled_from(WORDS), st.text(max_size=3))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(WORDS), inner, max_size=4)), max_leaves=12)


def _conforming(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the schema describes (our subset: oneOf, enum, object, array, string, integer, boolean),
    near its bounds: lists of minItems to minItems + 3 items, integers around the minimum, integral
    floats for integers."""
    if "oneOf" in schema and "type" not in schema:
        return st.one_of(*map(_conforming, schema["oneOf"]))
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = {key: _conforming(properties.get(key, {})) for key in schema.get("required", ())}
        optional = {key: _conforming(value) for key, value in properties.items() if key not in required}
        objects = st.fixed_dictionaries(required, optional=optional)
        if "oneOf" in schema:  # TOKENIZE: one of input and prompt
            return objects.filter(lambda body: sum(key in body for key in ("input", "prompt")) >= 1)
        return objects
    if kind == "array":
        low = schema.get("minItems", 0)
        return st.lists(_conforming(schema.get("items", {})), min_size=low, max_size=low + 3)
    if kind == "integer":
        low = schema.get("minimum", -3)
        return st.one_of(st.integers(low - 1, low + 3), st.sampled_from([float(low), float(low) + 0.5]))
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(max_size=3)
    return VALUES


def _mutated(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with one node (itself, or one inside it) replaced by any value."""
    children = list(value.items()) if isinstance(value, dict) else list(enumerate(value)) if isinstance(value, list) else []
    if not children or draw(st.integers(0, 3)) == 0:
        return draw(VALUES)
    key, child = draw(st.sampled_from(children))
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[key] = _mutated(draw, child)
    return copy


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@FUZZ
@given(data=st.data())
def test_fast_and_full_validators_agree(name: str, data: st.DataObject) -> None:
    schema = SCHEMAS[name]
    body = data.draw(_conforming(schema))
    if data.draw(st.booleans()):
        body = _mutated(data.draw, body)
    full = Draft202012Validator(schema).is_valid(body)
    try:
        _compiled(schema)(body)
        fast = True
    except Exception:  # noqa: BLE001 - fastjsonschema's rejection
        fast = False
    assert fast == full, f"{name}: fastjsonschema says {fast}, jsonschema {full} for {body!r}"


def test_valid_bodies_pass_and_invalid_ones_keep_jsonschemas_words() -> None:
    check_schema(body_schemas.EMBEDDINGS, {"model": "m", "input": [[1, 2], [3]], "dimensions": 2.0})
    check_schema(body_schemas.RERANK, {"query": "q", "documents": ["a", {"text": "b"}], "truncate": "END"})
    with pytest.raises(InvalidInput, match=r"^invalid request at 'input': .* is not valid under any of the given schemas"):
        check_schema(body_schemas.EMBEDDINGS, {"model": "m", "input": [True]})
    with pytest.raises(InvalidInput, match=r"^invalid request at 'dimensions': 0 is less than the minimum of 1$"):
        check_schema(body_schemas.EMBEDDINGS, {"model": "m", "input": "x", "dimensions": 0})
    with pytest.raises(InvalidInput, match=r"^invalid request at 'body': 'model' is a required property$"):
        check_schema(body_schemas.TOKENIZE, {"input": "x"})
